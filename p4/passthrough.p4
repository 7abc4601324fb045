/*
 * passthrough.p4: what a compromised DPU loads in the lab (scenario event compromise, how:
 * load-pipeline): port 0 to port 1 and back, everything, no classifier, no meter, no counters.
 * Not part of the limiter; it is here so that its compiled form is checked like every program.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

struct headers_t { ethernet_t ethernet; }
struct metadata_t { }

parser PassParser(packet_in packet, out headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition accept;
    }
}

control PassVerifyChecksum(inout headers_t hdr, inout metadata_t meta) { apply { } }

control PassIngress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t standard_metadata) {
    apply {
        standard_metadata.egress_spec = standard_metadata.ingress_port == 0 ? (bit<9>)1 : (bit<9>)0;
    }
}

control PassEgress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t standard_metadata) {
    apply { }
}

control PassComputeChecksum(inout headers_t hdr, inout metadata_t meta) { apply { } }

control PassDeparser(packet_out packet, in headers_t hdr) {
    apply { packet.emit(hdr.ethernet); }
}

V1Switch(PassParser(), PassVerifyChecksum(), PassIngress(), PassEgress(), PassComputeChecksum(),
         PassDeparser()) main;
