// Whole header stacks and header union stacks assigned at once (bmv2's assign_header_stack and
// assign_union_stack): the next index and every element copied, an invalid source element only
// invalidating its destination (bmv2's assign_header), with copies made in the control and inside
// an action, and pushes afterwards showing the copied next index.
//
// p4c 1.2.4 lowers each stack copy to assign_header element by element (member by member for a union
// stack) and never writes those two primitives. The corpus runs this program twice: as p4c compiles it
// (stack_copy.json), and as tests/corpus_semantics_cases.py's whole_stack_assignments rewrites that
// JSON, each such run of assign_header back into the one primitive (the case stack_copy_whole), which
// simple_switch_grpc loads and runs.
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header tag_t {
    bit<8> more;
    bit<8> v;
}

header op_t {
    bit<8> op;
    bit<8> n;
}

header a_t { bit<16> a; }
header b_t { bit<8> b; }

header_union ab_t {
    a_t a;
    b_t b;
}

struct headers_t {
    ethernet_t ethernet;
    op_t       op;
    tag_t[3]   src;
    tag_t[3]   dst;
    ab_t[2]    usrc;
    ab_t[2]    udst;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x9B00: op;
            default: accept;
        }
    }
    state op {
        pkt.extract(hdr.op);
        transition select(hdr.op.n) {
            0: accept;
            default: tags;
        }
    }
    state tags {
        pkt.extract(hdr.src.next);
        transition select(hdr.src.last.more) {
            0: accept;
            default: tags;
        }
    }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    action copy_in_action() {
        hdr.dst = hdr.src;
        hdr.dst.push_front(1);
        hdr.dst[0].setValid();
        hdr.dst[0].v = 0xEE;
    }
    table ops {
        key = { hdr.op.op : exact; }
        actions = { copy_in_action; NoAction; }
        default_action = NoAction();
        const entries = {
            2 : copy_in_action();
        }
    }
    apply {
        sm.egress_spec = 1;
        if (!hdr.op.isValid()) {
            return;
        }
        if (hdr.op.op == 1) {
            hdr.dst = hdr.src;
        }
        ops.apply();
        if (hdr.op.op == 3) {
            hdr.dst[1].setValid();
            hdr.dst[1].v = 0x11;
            hdr.dst = hdr.src;
        }
        if (hdr.op.op == 4 || hdr.op.op == 5) {
            hdr.usrc[0].a.setValid();
            hdr.usrc[0].a.a = 0xA0A0;
            hdr.usrc[1].b.setValid();
            hdr.usrc[1].b.b = (bit<8>)hdr.op.n;
            hdr.udst[0].b.setValid();
            hdr.udst[0].b.b = 0xBB;
            if (hdr.op.op == 5) {
                hdr.usrc[1].b.setInvalid();
            }
            hdr.udst = hdr.usrc;
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
        pkt.emit(hdr.src);
        pkt.emit(hdr.dst);
        pkt.emit(hdr.udst);
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
