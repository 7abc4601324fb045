/* lookahead_vset.p4: lookahead in a transition select and in an assignment, and a parser value set
 * (members written through P4Runtime ValueSetEntry) selecting which EtherTypes carry a tag. */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header tag_t {
    bit<8>  kind;
    bit<8>  value;
}

header out_t {
    bit<8>  path;   // which parser path the packet took
    bit<16> peek;   // 16 bits looked ahead after the ethernet header
    bit<8>  kind;
}

struct headers_t {
    ethernet_t ethernet;
    tag_t      tag;
    out_t      res;
}

struct metadata_t {
    bit<8>  path;
    bit<16> peek;
}

parser P(packet_in packet, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    value_set<bit<16>>(4) tagged_types;

    state start {
        packet.extract(hdr.ethernet);
        meta.peek = packet.lookahead<bit<16>>();
        transition select(hdr.ethernet.etherType) {
            tagged_types: parse_tag;
            default: peek_first;
        }
    }
    state parse_tag {
        packet.extract(hdr.tag);
        meta.path = 1;
        transition accept;
    }
    state peek_first {
        // the first nibble after ethernet: 4 looks like IPv4, 6 like IPv6
        transition select(packet.lookahead<bit<4>>()) {
            4: is_v4;
            6: is_v6;
            default: accept;
        }
    }
    state is_v4 {
        meta.path = 4;
        transition accept;
    }
    state is_v6 {
        meta.path = 6;
        transition accept;
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = 1;
        hdr.res.setValid();
        hdr.res.path = meta.path;
        hdr.res.peek = meta.peek;
        hdr.res.kind = hdr.tag.isValid() ? hdr.tag.kind : 8w0xff;
    }
}

control E(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) { apply { } }

control CC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control D(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.res);
        packet.emit(hdr.tag);
    }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
