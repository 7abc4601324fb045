// Signed int<N> fields with bmv2's two's-complement semantics: arithmetic that wraps, comparisons
// of negative values, arithmetic right shifts, casts between widths and signedness (sign-extending
// and truncating), a signed action parameter, and a table keyed on a signed field (its bits).
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header nums_t {
    int<8>  a;
    int<8>  b;
    int<16> wide;
    bit<8>  u;
    int<4>  n4;
    bit<4>  flags;
}

header out_t {
    int<8>  sum;
    int<8>  diff;
    int<8>  shr;
    int<8>  shl;
    int<16> ext;
    bit<8>  trunc;
    int<8>  neg;
    bit<8>  cmp;
    int<8>  param;
    int<8>  mul;
    bit<8>  hit;
}

struct headers_t {
    ethernet_t ethernet;
    nums_t     nums;
    out_t      res;
}

struct meta_t {
    int<8> m;
}

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x9800: nums;
            default: accept;
        }
    }
    state nums {
        pkt.extract(hdr.nums);
        pkt.extract(hdr.res);
        transition accept;
    }
}

control V(inout headers_t hdr, inout meta_t m) {
    apply { }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    action set_param(int<8> p) {
        hdr.res.param = p;
        hdr.res.hit = 1;
        m.m = p;
        if (m.m < 0) {
            hdr.res.hit = 2;
        }
        if (hdr.nums.a < p) {
            hdr.res.hit = hdr.res.hit | 4;
        }
    }
    table by_a {
        key = { hdr.nums.a : exact; }
        actions = { set_param; NoAction; }
        default_action = NoAction();
    }
    apply {
        sm.egress_spec = 1;
        if (!hdr.nums.isValid()) {
            return;
        }
        hdr.res.sum = hdr.nums.a + hdr.nums.b;
        hdr.res.diff = hdr.nums.a - hdr.nums.b;
        hdr.res.shr = hdr.nums.a >> 2;
        hdr.res.shl = hdr.nums.a << 3;
        hdr.res.ext = (int<16>)hdr.nums.a + hdr.nums.wide;
        hdr.res.trunc = (bit<8>)(bit<16>)hdr.nums.wide;
        hdr.res.neg = -hdr.nums.b;
        hdr.res.mul = hdr.nums.a * hdr.nums.b;
        bit<8> c = 0;
        if (hdr.nums.a < hdr.nums.b) { c = c | 1; }
        if (hdr.nums.a >= 0) { c = c | 2; }
        if (hdr.nums.wide > -300) { c = c | 4; }
        if ((int<8>)hdr.nums.u < 0) { c = c | 8; }
        if (hdr.nums.n4 < -2) { c = c | 16; }
        if ((int<8>)hdr.nums.n4 == hdr.nums.b) { c = c | 32; }
        if (hdr.nums.a > (int<8>)hdr.nums.wide) { c = c | 64; }
        hdr.res.cmp = c;
        by_a.apply();
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
        pkt.emit(hdr.nums);
        pkt.emit(hdr.res);
    }
}

V1Switch(P(), V(), I(), E(), C(), D()) main;
