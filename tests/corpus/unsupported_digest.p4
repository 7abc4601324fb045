/* unsupported_digest.p4: a digest (learn list), which the embedded target does not implement yet and
 * must refuse at SetForwardingPipelineConfig with the construct named. */
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

struct learn_t {
    bit<48> srcAddr;
    bit<9>  port;
}

struct metadata_t { }

parser P(packet_in packet, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    state start {
        packet.extract(hdr.ethernet);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    apply {
        digest<learn_t>(1, { hdr.ethernet.srcAddr, sm.ingress_port });
        sm.egress_spec = 1;
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
