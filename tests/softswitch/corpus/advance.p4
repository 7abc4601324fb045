// packet.advance in the parser: by a constant, by a header field (in bits) and by an expression; the
// skipped bytes leave the packet. Amounts that are no multiple of 8 (ParserInvalidArgument) or run
// past the frame (PacketTooShort) end the parse with the error, which ingress writes into the frame.
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

// how: 1 advance 16 bits, 2 by `bits`, 3 by bits * 2 + 8 (bit<32>), then extract `after`.
header skip_t {
    bit<8>  how;
    bit<8>  bits;
    bit<8>  err;
}

header after_t {
    bit<16> x;
}

struct headers_t {
    ethernet_t ethernet;
    skip_t     skip;
    after_t    after;
}

struct meta_t {
    bit<32> amount;
}

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x9A00: skip;
            default: accept;
        }
    }
    state skip {
        pkt.extract(hdr.skip);
        transition select(hdr.skip.how) {
            1: by_const;
            2: by_field;
            3: by_expr;
            default: accept;
        }
    }
    state by_const {
        pkt.advance(16);
        transition after;
    }
    state by_field {
        m.amount = (bit<32>)hdr.skip.bits;
        pkt.advance(m.amount);
        transition after;
    }
    state by_expr {
        pkt.advance((bit<32>)hdr.skip.bits * 2 + 8);
        transition after;
    }
    state after {
        pkt.extract(hdr.after);
        transition accept;
    }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = 1;
        if (sm.parser_error == error.ParserInvalidArgument) {
            hdr.skip.err = 6;
        } else if (sm.parser_error == error.PacketTooShort) {
            hdr.skip.err = 1;
        }
    }
}

control E(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    apply { }
}

control C(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control D(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.skip);
        pkt.emit(hdr.after);
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
