/* registers_exit.p4: a register read-modify-written per ingress port (the old value is written into
 * the frame, so bmv2's state is visible without P4Runtime register reads), exit in ingress, and
 * mark_to_drop and exit in egress. */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header stat_t {
    bit<32> before;    // register value before this packet
    bit<8>  marks;     // bits set by the stages the packet went through
}

struct headers_t {
    ethernet_t ethernet;
    stat_t     stat;
}

struct metadata_t {
    bit<32> value;
}

parser P(packet_in packet, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    state start {
        packet.extract(hdr.ethernet);
        packet.extract(hdr.stat);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    register<bit<32>>(4) seen;

    apply {
        sm.egress_spec = 1;
        seen.read(meta.value, (bit<32>)sm.ingress_port);
        hdr.stat.before = meta.value;
        seen.write((bit<32>)sm.ingress_port, meta.value + (bit<32>)hdr.stat.marks + 1);
        hdr.stat.marks = hdr.stat.marks | 0x01;
        if (hdr.ethernet.etherType == 0x0001) {
            exit;  // ingress ends here; egress still runs
        }
        hdr.stat.marks = hdr.stat.marks | 0x02;
    }
}

control E(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    apply {
        hdr.stat.marks = hdr.stat.marks | 0x04;
        if (hdr.ethernet.etherType == 0x0002) {
            mark_to_drop(sm);  // dropped after egress, as simple_switch checks egress_spec
        }
        if (hdr.ethernet.etherType == 0x0003) {
            exit;
        }
        hdr.stat.marks = hdr.stat.marks | 0x08;
    }
}

control CC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control D(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.stat);
    }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
