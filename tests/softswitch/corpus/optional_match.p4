// The `optional` match kind: p4c writes it as ternary in the bmv2 JSON (P4Info says OPTIONAL), and PI
// writes a P4Runtime optional match to bmv2 as ternary with an all-ones mask, or a zero mask when the
// field is left out. Entries written through P4Runtime and const entries.
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header probe_t {
    bit<16> kind;
    bit<8>  flags;
    bit<12> vid;
    bit<4>  pad;
    bit<8>  hit;
    bit<8>  hit2;
}

struct headers_t {
    ethernet_t ethernet;
    probe_t    probe;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x9600: probe;
            default: accept;
        }
    }
    state probe { pkt.extract(hdr.probe); transition accept; }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    action mark(bit<8> v) { hdr.probe.hit = v; }
    action mark2(bit<8> v) { hdr.probe.hit2 = v; }
    table opt {
        key = { hdr.probe.kind : optional; hdr.probe.flags : exact; hdr.probe.vid : optional; }
        actions = { mark; NoAction; }
        default_action = NoAction();
    }
    table opt_const {
        key = { hdr.probe.kind : optional; hdr.probe.vid : optional; }
        actions = { mark2; }
        const entries = {
            (0x0800, _) : mark2(1);
            (_, 0x123) : mark2(2);
            (0x86DD, 0xFFF) : mark2(3);
            (_, _) : mark2(4);
        }
    }
    apply {
        if (hdr.probe.isValid()) {
            opt.apply();
            opt_const.apply();
            sm.egress_spec = 1;
        } else {
            mark_to_drop(sm);
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
        pkt.emit(hdr.probe);
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
