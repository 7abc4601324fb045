// A table that p4c keeps in the P4Info (written from the front end's output) and leaves out of the bmv2
// JSON (its mid-end finds it never applied). simple_switch_grpc loads the program; PI fails what would
// need the table in bmv2 (INVALID_TABLE_NAME) and answers the rest as it would for any table.
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

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start { pkt.extract(hdr.ethernet); transition accept; }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    action fwd(bit<9> port) { sm.egress_spec = port; }
    action retag(bit<16> t) { hdr.ethernet.etherType = t; }
    table live {
        key = { hdr.ethernet.etherType : exact; }
        actions = { fwd; NoAction; }
        default_action = NoAction();
    }
    table dead {
        key = { hdr.ethernet.srcAddr : exact; }
        actions = { retag; NoAction; }
        default_action = NoAction();
    }
    apply {
        bool debug = false;
        live.apply();
        if (debug) {
            dead.apply();
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
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
