// Indirect counters (packets, bytes, both) and meters (bytes, packets), indexed by a header field,
// configured and read through P4Runtime.
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

// idx picks the cells; the pipeline writes both meters' colours back.
header res_t {
    bit<8> idx;
    bit<8> byte_color;
    bit<8> packet_color;
}

struct headers_t {
    ethernet_t ethernet;
    res_t      res;
}

struct meta_t {
    bit<8> byte_color;
    bit<8> packet_color;
}

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x9200: res;
            default: accept;
        }
    }
    state res { pkt.extract(hdr.res); transition accept; }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    counter(4, CounterType.packets) by_packets;
    counter(4, CounterType.bytes) by_bytes;
    counter(4, CounterType.packets_and_bytes) by_both;
    meter(4, MeterType.bytes) byte_meter;
    meter(4, MeterType.packets) packet_meter;

    apply {
        sm.egress_spec = 1;
        if (hdr.res.isValid()) {
            bit<32> i = (bit<32>) hdr.res.idx;
            by_packets.count(i);
            by_bytes.count(i);
            by_both.count(i);
            byte_meter.execute_meter(i, m.byte_color);
            packet_meter.execute_meter(i, m.packet_color);
            hdr.res.byte_color = m.byte_color;
            hdr.res.packet_color = m.packet_color;
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
        pkt.emit(hdr.res);
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
