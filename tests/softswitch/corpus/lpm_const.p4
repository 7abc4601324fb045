// LPM keys: const entries whose values have bits set past their prefix (bmv2's trie compares the prefix
// alone, so 0x11/4 matches 0x10..0x1F), an LPM key behind an exact one and beside a ternary one, and an
// LPM table the controller writes (P4Runtime wants its values masked already; PI refuses the rest).
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

// a and b are looked up; hit1..hit4 say which entry of each table matched (0 until one does).
header probe_t {
    bit<8>  a;
    bit<16> b;
    bit<8>  hit1;
    bit<8>  hit2;
    bit<8>  hit3;
    bit<8>  hit4;
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
            0x9300: probe;
            default: accept;
        }
    }
    state probe { pkt.extract(hdr.probe); transition accept; }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    action mark1(bit<8> v) { hdr.probe.hit1 = v; }
    action mark2(bit<8> v) { hdr.probe.hit2 = v; }
    action mark3(bit<8> v) { hdr.probe.hit3 = v; }
    action mark4(bit<8> v) { hdr.probe.hit4 = v; }
    // The LPM key alone.
    table prefixes {
        key = { hdr.probe.a : lpm; }
        actions = { mark1; }
        const entries = {
            0x11 &&& 0xF0 : mark1(1);
            0x17 &&& 0xFF : mark1(2);
            0xC5 &&& 0xC0 : mark1(3);
        }
        default_action = mark1(0xEE);
    }
    // An exact key and an LPM key: still an LPM table to bmv2 (the prefix counts the exact bits too).
    table by_b {
        key = { hdr.probe.b : exact; hdr.probe.a : lpm; }
        actions = { mark2; }
        const entries = {
            (0x0001, 0x23 &&& 0xF0) : mark2(1);
            (0x0001, 0x2B &&& 0xF8) : mark2(2);
            (0x0002, _) : mark2(3);
        }
    }
    // A ternary key beside an LPM key: a ternary table to bmv2, the prefix becoming a mask.
    table mixed {
        key = { hdr.probe.b : ternary; hdr.probe.a : lpm; }
        actions = { mark3; }
        const entries = {
            (0x0100 &&& 0xFF00, 0x35 &&& 0xF0) : mark3(1);
            (_, 0x3F &&& 0xFC) : mark3(2);
        }
    }
    // Written through P4Runtime.
    table routes {
        key = { hdr.probe.b : lpm; }
        actions = { mark4; }
    }
    apply {
        if (hdr.probe.isValid()) {
            prefixes.apply();
            by_b.apply();
            mixed.apply();
            routes.apply();
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
