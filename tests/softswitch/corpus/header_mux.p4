// A header assigned from `c ? h1 : h2`, with sources valid or not (an invalid source makes the
// destination invalid, its fields untouched). Inside an action p4c keeps the choice as an expression
// of header type, nested ones too, which bmv2 evaluates when the assignment runs; in the control's
// body p4c 1.2.4 turns it into if/else.
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

// c chooses the source; d says which of a and b the frame carries (bit 0: a, bit 1: b).
header sel_t {
    bit<8> c;
    bit<8> d;
}

header pair_t {
    bit<16> x;
    bit<16> y;
}

struct headers_t {
    ethernet_t ethernet;
    sel_t      sel;
    pair_t     a;
    pair_t     b;
    pair_t     dst;
    pair_t     dst2;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x9500: sel;
            default: accept;
        }
    }
    state sel {
        pkt.extract(hdr.sel);
        transition select(hdr.sel.d) {
            1: only_a;
            2: only_b;
            3: both;
            default: accept;
        }
    }
    state only_a { pkt.extract(hdr.a); transition accept; }
    state only_b { pkt.extract(hdr.b); transition accept; }
    state both { pkt.extract(hdr.a); pkt.extract(hdr.b); transition accept; }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    action nested() {
        hdr.dst2 = hdr.sel.c == 1 ? hdr.a : (hdr.sel.c == 2 ? hdr.b : hdr.dst);
        hdr.dst2.y = hdr.dst2.y + 1;
    }
    action swapped() {
        hdr.dst2 = hdr.sel.c == 1 ? hdr.b : hdr.a;
    }
    table pick {
        key = { hdr.sel.d : exact; }
        actions = { nested; swapped; NoAction; }
        default_action = NoAction();
    }
    apply {
        if (hdr.sel.isValid()) {
            hdr.dst = hdr.sel.c == 1 ? hdr.a : hdr.b;
            pick.apply();
        }
        sm.egress_spec = 1;
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
        pkt.emit(hdr.sel);
        pkt.emit(hdr.a);
        pkt.emit(hdr.b);
        pkt.emit(hdr.dst);
        pkt.emit(hdr.dst2);
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
