/* direct_res.p4: a table with a direct counter (packets and bytes) and a direct byte meter whose colour
 * the action reads; red is dropped, the colour is written into the frame (first byte of srcAddr). */
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

struct metadata_t {
    bit<2> color;
}

parser P(packet_in packet, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    state start {
        packet.extract(hdr.ethernet);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    direct_counter(CounterType.packets_and_bytes) hits;
    direct_meter<bit<2>>(MeterType.bytes) policer;

    action fwd(bit<9> port) {
        policer.read(meta.color);
        hits.count();
        sm.egress_spec = port;
    }
    action deny() {
        policer.read(meta.color);
        hits.count();
        mark_to_drop(sm);
    }
    table classify {
        key = { hdr.ethernet.etherType: exact; }
        actions = { fwd; deny; }
        default_action = deny();
        counters = hits;
        meters = policer;
    }
    apply {
        meta.color = 3;  // a miss leaves it untouched
        classify.apply();
        hdr.ethernet.srcAddr[47:40] = (bit<8>)meta.color;
        if (meta.color == 2) {
            mark_to_drop(sm);
        }
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
