/* header_stack.p4: an MPLS label stack: extract into .next, select on .last, push_front/pop_front,
 * constant and runtime stack indexes in actions, validity of elements, emitting the stack. */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header mpls_t {
    bit<20> label;
    bit<3>  tc;
    bit<1>  bos;
    bit<8>  ttl;
}

header info_t {
    bit<8> depth;     // how many labels were valid at ingress
    bit<8> last_ttl;  // ttl of the last extracted label
    bit<32> picked;   // the label at the runtime index of the table entry
}

struct headers_t {
    ethernet_t ethernet;
    mpls_t[3]  mpls;
    info_t     info;
}

struct metadata_t {
    bit<8> last_ttl;
    bit<2> idx;
}

parser P(packet_in packet, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x8847: parse_mpls;
            default: accept;
        }
    }
    state parse_mpls {
        packet.extract(hdr.mpls.next);
        meta.last_ttl = hdr.mpls.last.ttl;
        transition select(hdr.mpls.last.bos) {
            0: parse_mpls;
            default: parse_info;
        }
    }
    state parse_info {
        packet.extract(hdr.info);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    action pop() {
        hdr.mpls.pop_front(1);
    }
    action push(bit<20> label) {
        hdr.mpls.push_front(1);
        hdr.mpls[0].setValid();
        hdr.mpls[0].label = label;
        hdr.mpls[0].ttl = 64;
        hdr.mpls[0].bos = 0;
    }
    action swap(bit<20> label) {
        hdr.mpls[0].label = label;
        hdr.mpls[0].ttl = hdr.mpls[0].ttl - 1;
        hdr.mpls[0].tc = label == 401 ? 3w5 : 3w1;  // an action parameter inside an expression
    }
    action pick() {
        // A runtime index from a metadata field. (An index straight from an action parameter makes
        // p4c 1.2.4 emit "runtime_data" inside an expression, which bmv2 refuses to load.)
        hdr.info.picked = (bit<32>)hdr.mpls[meta.idx].label;
        hdr.mpls[meta.idx].tc = 7;
    }
    table labels {
        key = { hdr.mpls[0].label: exact; }
        actions = { pop; push; swap; pick; NoAction; }
        default_action = NoAction();
    }
    apply {
        sm.egress_spec = 1;
        if (hdr.info.isValid()) {
            hdr.info.last_ttl = meta.last_ttl;
            hdr.info.depth = 0;
            if (hdr.mpls[0].isValid()) { hdr.info.depth = hdr.info.depth + 1; }
            if (hdr.mpls[1].isValid()) { hdr.info.depth = hdr.info.depth + 1; }
            if (hdr.mpls[2].isValid()) { hdr.info.depth = hdr.info.depth + 1; }
        }
        meta.idx = (bit<2>)hdr.info.picked;
        if (sm.parser_error != error.NoError) {
            sm.egress_spec = 2;
        }
        labels.apply();
    }
}

control E(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) { apply { } }

control CC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control D(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.mpls);
        packet.emit(hdr.info);
    }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
