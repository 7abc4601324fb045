/* action_selector.p4: an action profile table (l2, whose action decides what runs next) and two action
 * selector tables: ecmp (crc16 over the IPv4 source, protocol and UDP ports; programmed with members and
 * groups) and lb (crc32 over the IPv4 source and UDP destination port; programmed with one-shot action
 * sets). The chosen next hop is written into the frame (egress port, destination MAC). A miss in any of
 * them runs no action (bmv2 JSON has no default action for tables with an action profile). */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> totalLen;
    bit<16> identification;
    bit<3>  flags;
    bit<13> fragOffset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdrChecksum;
    bit<32> srcAddr;
    bit<32> dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length;
    bit<16> checksum;
}

struct headers_t {
    ethernet_t ethernet;
    ipv4_t     ipv4;
    udp_t      udp;
}

struct metadata_t { }

parser P(packet_in packet, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x0800: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.protocol) {
            17: parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        packet.extract(hdr.udp);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    action_profile(32w64) ap;
    @max_group_size(4) action_selector(HashAlgorithm.crc16, 32w128, 32w14) sel;
    action_selector(HashAlgorithm.crc32, 32w64, 32w16) sel2;

    action drop() {
        mark_to_drop(sm);
    }
    action to_port(bit<9> port) {
        sm.egress_spec = port;
    }
    action route() {
        hdr.ethernet.srcAddr = 0x02000000ffff;
    }
    action set_nhop(bit<9> port, bit<48> dmac) {
        sm.egress_spec = port;
        hdr.ethernet.dstAddr = dmac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }
    table l2 {
        key = { hdr.ethernet.dstAddr: exact; }
        actions = { to_port; route; drop; }
        implementation = ap;
    }
    table ecmp {
        key = {
            hdr.ipv4.dstAddr: lpm;
            hdr.ipv4.srcAddr: selector;
            hdr.ipv4.protocol: selector;
            hdr.udp.srcPort: selector;
            hdr.udp.dstPort: selector;
        }
        actions = { set_nhop; drop; }
        // p4c warns that it drops this for bmv2 (no default_entry in the JSON): a miss runs no action.
        default_action = drop();
        implementation = sel;
    }
    table lb {
        key = {
            hdr.ipv4.dstAddr: exact;
            hdr.ipv4.srcAddr: selector;
            hdr.udp.dstPort: selector;
        }
        actions = { set_nhop; NoAction; }
        implementation = sel2;
    }
    apply {
        switch (l2.apply().action_run) {
            route: {
                if (hdr.ipv4.isValid()) {
                    if (!lb.apply().hit) {
                        ecmp.apply();
                    }
                }
            }
        }
    }
}

control E(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) { apply { } }

control CC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control D(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
    }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
