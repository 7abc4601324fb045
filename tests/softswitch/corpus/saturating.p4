// The saturating operators |+| and |-| on bit<N> and int<N>, in the control and inside an action
// (an action parameter as operand), with results clamped to the type's range as bmv2 does.
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header sat_t {
    bit<8>  ua;
    bit<8>  ub;
    int<8>  sa;
    int<8>  sb;
    bit<16> wa;
}

header res_t {
    bit<8>  uadd;
    bit<8>  usub;
    int<8>  sadd;
    int<8>  ssub;
    bit<16> wadd;
    bit<8>  padd;
    int<8>  psub;
}

struct headers_t {
    ethernet_t ethernet;
    sat_t      sat;
    res_t      res;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x9900: sat;
            default: accept;
        }
    }
    state sat {
        pkt.extract(hdr.sat);
        pkt.extract(hdr.res);
        transition accept;
    }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    action with_param(bit<8> u, int<8> s) {
        hdr.res.padd = hdr.sat.ua |+| u;
        hdr.res.psub = hdr.sat.sa |-| s;
    }
    table params {
        key = { hdr.sat.ua : exact; }
        actions = { with_param; NoAction; }
        default_action = with_param(200, 100);
    }
    apply {
        sm.egress_spec = 1;
        if (hdr.sat.isValid()) {
            hdr.res.uadd = hdr.sat.ua |+| hdr.sat.ub;
            hdr.res.usub = hdr.sat.ua |-| hdr.sat.ub;
            hdr.res.sadd = hdr.sat.sa |+| hdr.sat.sb;
            hdr.res.ssub = hdr.sat.sa |-| hdr.sat.sb;
            hdr.res.wadd = hdr.sat.wa |+| (bit<16>)hdr.sat.ub;
            params.apply();
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
        pkt.emit(hdr.sat);
        pkt.emit(hdr.res);
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
