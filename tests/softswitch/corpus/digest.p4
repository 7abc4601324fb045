/* digest.p4: v1model digests (bmv2 learn lists). A source MAC the smac table does not know is learned
 * with its ingress port (digest mac_learn_t); frames of EtherType 0x88B6 also send a flow_t digest of
 * the metadata struct, which, as the later call, replaces the mac_learn_t one (simple_switch keeps
 * one learn register per packet). A frame dmac drops is still learned. simple_switch samples the
 * learn list's fields at the end of ingress, but p4c (1.2.4) copies a digest's data into temporaries
 * at the call, even a struct variable's, so the mark changed after the call does not show (the test
 * of that edits the JSON). */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

struct headers_t {
    ethernet_t ethernet;
}

struct mac_learn_t {
    bit<48> srcAddr;
    bit<9>  port;
}

struct flow_t {
    bit<16> etherType;
    bit<4>  mark;
    bit<12> vid;
}

struct metadata_t {
    flow_t flow;
}

parser P(packet_in packet, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    state start {
        packet.extract(hdr.ethernet);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    action learn_mac() {
        digest<mac_learn_t>(1, { hdr.ethernet.srcAddr, sm.ingress_port });
    }
    table smac {
        key = { hdr.ethernet.srcAddr: exact; }
        actions = { learn_mac; NoAction; }
        default_action = learn_mac();
    }
    action fwd(bit<9> port) {
        sm.egress_spec = port;
    }
    action drop() {
        mark_to_drop(sm);
    }
    table dmac {
        key = { hdr.ethernet.dstAddr: exact; }
        actions = { fwd; drop; }
        default_action = drop();
    }
    apply {
        smac.apply();
        if (hdr.ethernet.etherType == 0x88B6) {
            meta.flow.etherType = hdr.ethernet.etherType;
            meta.flow.vid = 0xABC;
            meta.flow.mark = 1;
            digest<flow_t>(2, meta.flow);
            meta.flow.mark = 2;
        }
        dmac.apply();
    }
}

control E(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) { apply { } }

control CC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control D(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
    }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
