// Varbit fields with bmv2's semantics: extract with a length expression (in bits), emit with the
// extracted width, the width following assignments (whole headers and varbit fields), setValid
// keeping the width, parser errors (ParserInvalidArgument, HeaderTooShort, PacketTooShort,
// StackOutOfBounds), a checksum over a varbit field, and varbit headers extracted into a header stack
// and into a header union stack's members, and shifted by push_front (each element keeps its width).
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

// nbits: the option's data length in bits; op: what ingress does; err: the parser error seen.
header probe_t {
    bit<8>  nbits;
    bit<8>  op;
    bit<8>  err;
    bit<16> csum;
}

header opt_t {
    bit<4>       kind;
    bit<4>       flags;
    varbit<64>   data;
}

header small_t {
    bit<8> s;
}

header_union either_t {
    opt_t   opt;
    small_t small;
}

struct headers_t {
    ethernet_t  ethernet;
    probe_t     probe;
    opt_t       opt;
    opt_t       copy;
    ethernet_t  after;
    opt_t[2]    more;
    either_t[2] us;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x9700: probe;
            default: accept;
        }
    }
    state probe {
        pkt.extract(hdr.probe);
        pkt.extract(hdr.opt, (bit<32>)hdr.probe.nbits);
        transition select(hdr.probe.op) {
            7: after;
            9: two_more;
            10: three_more;
            11: unions;
            default: accept;
        }
    }
    state two_more {
        pkt.extract(hdr.more.next, (bit<32>)hdr.probe.nbits);
        pkt.extract(hdr.more.next, (bit<32>)hdr.probe.nbits + 8);
        transition accept;
    }
    state three_more {
        pkt.extract(hdr.more.next, (bit<32>)hdr.probe.nbits);
        pkt.extract(hdr.more.next, (bit<32>)hdr.probe.nbits);
        pkt.extract(hdr.more.next, (bit<32>)hdr.probe.nbits);
        transition accept;
    }
    state unions {
        pkt.extract(hdr.us.next.small);
        pkt.extract(hdr.us.next.opt, (bit<32>)hdr.probe.nbits);
        transition accept;
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
    action copy_whole() {
        hdr.copy = hdr.opt;
    }
    action copy_data() {
        hdr.copy.setValid();
        hdr.copy.kind = 0xC;
        hdr.copy.data = hdr.opt.data;
    }
    table ops {
        key = { hdr.probe.op : exact; }
        actions = { copy_whole; copy_data; NoAction; }
        default_action = NoAction();
        const entries = {
            1 : copy_whole();
            2 : copy_data();
        }
    }
    apply {
        sm.egress_spec = 1;
        if (!hdr.probe.isValid()) {
            return;
        }
        if (sm.parser_error == error.ParserInvalidArgument) {
            hdr.probe.err = 6;
        } else if (sm.parser_error == error.HeaderTooShort) {
            hdr.probe.err = 4;
        } else if (sm.parser_error == error.PacketTooShort) {
            hdr.probe.err = 1;
        } else if (sm.parser_error == error.StackOutOfBounds) {
            hdr.probe.err = 3;
        }
        ops.apply();
        if (hdr.probe.op == 3) {
            hdr.opt.setInvalid();
        } else if (hdr.probe.op == 4) {
            hdr.copy.setValid();
            hdr.copy.flags = 5;
        } else if (hdr.probe.op == 5) {
            hdr.opt.setInvalid();
            hdr.copy = hdr.opt;
        } else if (hdr.probe.op == 6) {
            hdr.copy = hdr.opt;
            hdr.copy.setInvalid();
            hdr.copy.setValid();
        } else if (hdr.probe.op == 9) {
            hdr.more.push_front(1);
        }
    }
}

control E(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    apply { }
}

control C(inout headers_t hdr, inout meta_t m) {
    apply {
        update_checksum(hdr.probe.isValid() && hdr.probe.op == 8,
            { hdr.opt.kind, hdr.opt.flags, hdr.opt.data, hdr.probe.nbits },
            hdr.probe.csum, HashAlgorithm.csum16);
    }
}

control D(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.probe);
        pkt.emit(hdr.opt);
        pkt.emit(hdr.copy);
        pkt.emit(hdr.after);
        pkt.emit(hdr.more);
        pkt.emit(hdr.us);
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
