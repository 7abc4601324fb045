/* hashes.p4: hash() with every algorithm bmv2 ships (crc16, crc32, crc16_custom and crc32_custom with
 * their defaults, identity, csum16, xor16, random excluded), with base and max, and an update_checksum
 * computed with crc16 instead of csum16. The results are written into an output header. */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header in_t {
    bit<32> a;
    bit<16> b;
    bit<4>  c;
    bit<4>  d;
}

header out_t {
    bit<16> crc16;
    bit<32> crc32;
    bit<16> crc16_custom;
    bit<32> crc32_custom;
    bit<16> identity;
    bit<16> csum16;
    bit<16> xor16;
    bit<32> ranged;      // crc32 with base 100 and max 1000
    bit<64> ident_wide;  // identity of 9 bytes into 64 bits
    bit<16> ck;          // update_checksum with crc16
    bit<8>  odd;         // crc16 of 12 bits of input (not whole bytes)
}

struct headers_t {
    ethernet_t ethernet;
    in_t       in_;
    out_t      res;
}

struct metadata_t { }

parser P(packet_in packet, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    state start {
        packet.extract(hdr.ethernet);
        packet.extract(hdr.in_);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = 1;
        hdr.res.setValid();
        hash(hdr.res.crc16, HashAlgorithm.crc16, 16w0, { hdr.in_.a, hdr.in_.b }, 32w65536);
        hash(hdr.res.crc32, HashAlgorithm.crc32, 32w0, { hdr.in_.a, hdr.in_.b }, 64w4294967296);
        hash(hdr.res.crc16_custom, HashAlgorithm.crc16_custom, 16w0, { hdr.in_.a, hdr.in_.b }, 32w65536);
        hash(hdr.res.crc32_custom, HashAlgorithm.crc32_custom, 32w0, { hdr.in_.a, hdr.in_.b }, 64w4294967296);
        hash(hdr.res.identity, HashAlgorithm.identity, 16w0, { hdr.in_.b }, 32w65536);
        hash(hdr.res.csum16, HashAlgorithm.csum16, 16w0, { hdr.in_.a, hdr.in_.b }, 32w65536);
        hash(hdr.res.xor16, HashAlgorithm.xor16, 16w0, { hdr.in_.a, hdr.in_.b }, 32w65536);
        hash(hdr.res.ranged, HashAlgorithm.crc32, 32w100, { hdr.in_.a, hdr.in_.b, hdr.in_.c, hdr.in_.d }, 32w1000);
        hash(hdr.res.ident_wide, HashAlgorithm.identity, 64w0,
             { hdr.ethernet.srcAddr, hdr.in_.b, hdr.in_.c, hdr.in_.d }, 64w0xffffffffffffffff);
        hash(hdr.res.odd, HashAlgorithm.crc16, 8w0, { hdr.in_.c, hdr.in_.b[7:0] }, 16w256);
    }
}

control E(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) { apply { } }

control CC(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(hdr.res.isValid(), { hdr.in_.a, hdr.in_.b }, hdr.res.ck, HashAlgorithm.crc16);
    }
}

control D(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.in_);
        packet.emit(hdr.res);
    }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
