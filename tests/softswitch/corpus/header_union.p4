// Header unions: extraction, setValid, setInvalid, header and union assignment, isValid on unions
// and members, and what bmv2 leaves in the fields of a member another member displaced.
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header short_t {
    bit<8>  kind;
    bit<32> addr;
}

header long_t {
    bit<8>   kind;
    bit<128> addr;
}

header_union addr_t {
    short_t s;
    long_t  l;
}

// What the pipeline saw, written at the end: one bit per validity.
header report_t {
    bit<8>  op;
    bit<8>  seen;
    bit<32> low;
}

struct headers_t {
    ethernet_t ethernet;
    report_t   report;
    addr_t     a;
    addr_t     b;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.report);
        transition select(hdr.ethernet.etherType) {
            0x9004: short_a;
            0x9006: long_a;
            0x9046: both_a;
            0x9044: two;
            default: accept;
        }
    }
    state short_a { pkt.extract(hdr.a.s); transition accept; }
    state long_a { pkt.extract(hdr.a.l); transition accept; }
    // Extracting a second member of a union displaces the first.
    state both_a { pkt.extract(hdr.a.s); pkt.extract(hdr.a.l); transition accept; }
    state two { pkt.extract(hdr.a.s); pkt.extract(hdr.b.s); transition accept; }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    // widen and narrow read the other member, so they are sent only where this packet extracted it.
    action widen() {
        // Reads a.s after a.l displaced it: bmv2 keeps a displaced member's fields.
        hdr.a.l.setValid();
        hdr.a.l.kind = hdr.a.s.kind + 1;
        hdr.a.l.addr = (bit<128>) hdr.a.s.addr;
    }
    action narrow() {
        hdr.a.s.setValid();
        hdr.a.s.addr = hdr.a.l.addr[31:0];
    }
    action copy_union() {
        hdr.b = hdr.a;
    }
    action copy_member() {
        hdr.b.s = hdr.a.s;
    }
    action drop_member() {
        hdr.a.s.setInvalid();
    }
    action revalidate() {
        // setValid on an already valid member changes nothing; on an invalid one it displaces its peer.
        hdr.a.s.setValid();
        hdr.b.l.setValid();
        hdr.b.l.kind = 0x77;
    }
    table ops {
        key = { hdr.report.op : exact; }
        actions = { widen; narrow; copy_union; copy_member; drop_member; revalidate; NoAction; }
        default_action = NoAction();
    }
    apply {
        sm.egress_spec = 1;
        if (hdr.report.isValid()) {
            ops.apply();
            bit<8> seen = 0;
            if (hdr.a.isValid()) { seen = seen | 1; }
            if (hdr.a.s.isValid()) { seen = seen | 2; }
            if (hdr.a.l.isValid()) { seen = seen | 4; }
            if (hdr.b.isValid()) { seen = seen | 8; }
            if (hdr.b.s.isValid()) { seen = seen | 16; }
            if (hdr.b.l.isValid()) { seen = seen | 32; }
            hdr.report.seen = seen;
            // a.s's fields are read only where this packet wrote them: bmv2 does not clear an invalid
            // header's fields between packets, so elsewhere they hold what an earlier packet left.
            if (hdr.a.s.isValid() || hdr.ethernet.etherType == 0x9046) {
                hdr.report.low = hdr.a.s.addr;
            }
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
        pkt.emit(hdr.report);
        pkt.emit(hdr.a);
        pkt.emit(hdr.b);
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
