// Header union stacks: extraction into the next union by member, overflow, push_front and pop_front (bmv2 rotates a union stack: see tests/softswitch/test_corpus.py), setValid of
// an element's member, isValid of each element.
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header op_t {
    bit<8> op;
    bit<8> seen;  // written by the pipeline: one bit per valid b-member, then per valid a-member
}

header a_t {
    bit<8> tag;   // 1: a, 2: b, anything else ends the stack
    bit<8> x;
}

header b_t {
    bit<8>  tag;
    bit<16> y;
}

header_union ab_t {
    a_t a;
    b_t b;
}

struct headers_t {
    ethernet_t ethernet;
    op_t       op;
    ab_t[3]    us;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x9100: ops;
            default: accept;
        }
    }
    state ops {
        pkt.extract(hdr.op);
        transition next;
    }
    state next {
        transition select(pkt.lookahead<bit<8>>()) {
            1: take_a;
            2: take_b;
            default: accept;
        }
    }
    // A select on hdr.us.last.a.x would be the natural end test, but p4c 1.2.4 writes that key as
    // a field of a header "us" (no such header), which neither target loads: the tag ends the stack.
    state take_a {
        pkt.extract(hdr.us.next.a);
        transition next;
    }
    state take_b {
        pkt.extract(hdr.us.next.b);
        transition next;
    }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    action pop1() { hdr.us.pop_front(1); }
    action pop2() { hdr.us.pop_front(2); }
    action push1() { hdr.us.push_front(1); }
    action to_b() {
        // An element's other member made valid displaces the one there.
        hdr.us[1].b.setValid();
        hdr.us[1].b.tag = 2;
        hdr.us[1].b.y = 0xBEEF;
    }
    table ops {
        key = { hdr.op.op : exact; }
        actions = { pop1; pop2; push1; to_b; NoAction; }
        default_action = NoAction();
    }
    apply {
        sm.egress_spec = 1;
        if (hdr.op.isValid()) {
            ops.apply();
            // Not hdr.us[i].isValid(): p4c 1.2.4 writes it as valid_union of a "header" us[i], which
            // bmv2 refuses to load ("Invalid reference to object of type 'header'").
            bit<8> seen = 0;
            if (hdr.us[0].b.isValid()) { seen = seen | 1; }
            if (hdr.us[1].b.isValid()) { seen = seen | 2; }
            if (hdr.us[2].b.isValid()) { seen = seen | 4; }
            if (hdr.us[0].a.isValid()) { seen = seen | 16; }
            if (hdr.us[1].a.isValid()) { seen = seen | 32; }
            if (hdr.us[2].a.isValid()) { seen = seen | 64; }
            hdr.op.seen = seen;
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
        pkt.emit(hdr.op);
        pkt.emit(hdr.us);
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
