/* replication.p4: multicast through the packet replication engine, clone I2E and E2E through clone
 * sessions, resubmit and recirculate with preserved user metadata. Egress stamps each copy's
 * instance_type, egress_rid, egress_port and preserved metadata into the source MAC, and ingress
 * its instance_type into the destination MAC, so that every copy that leaves shows which path made
 * it (simple_switch sets instance_type to NORMAL again for any packet that leaves ingress unicast). */
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
    @field_list(1)
    bit<8> passes;
    bit<8> scratch;  // not preserved
}

parser P(packet_in packet, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    state start {
        packet.extract(hdr.ethernet);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    action to_port(bit<9> port) {
        sm.egress_spec = port;
    }
    action flood(bit<16> group) {
        sm.mcast_grp = group;
    }
    action mirror(bit<9> port, bit<32> session) {
        sm.egress_spec = port;
        clone_preserving_field_list(CloneType.I2E, session, 1);
    }
    action again(bit<9> port) {
        sm.egress_spec = port;
        meta.scratch = 0xaa;
        meta.passes = meta.passes + 1;
        resubmit_preserving_field_list(1);
    }
    table fwd {
        key = { hdr.ethernet.etherType: exact; }
        actions = { to_port; flood; mirror; again; NoAction; }
        default_action = NoAction();
    }
    apply {
        sm.egress_spec = 511;  // drop unless an action says otherwise
        if (meta.passes < 2) {
            fwd.apply();
        } else {
            sm.egress_spec = 3;  // resubmitted twice: out of port 3
        }
        hdr.ethernet.dstAddr[47:40] = meta.scratch;
        hdr.ethernet.dstAddr[39:32] = (bit<8>)sm.instance_type;  // as ingress sees it
    }
}

control E(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    apply {
        hdr.ethernet.srcAddr = (bit<8>)sm.instance_type ++ (bit<16>)sm.egress_rid ++ (bit<16>)sm.egress_port
                               ++ meta.passes;
        if (sm.instance_type == 0 && hdr.ethernet.etherType == 0x0e2e) {
            clone_preserving_field_list(CloneType.E2E, 7, 1);
        }
        if (meta.passes != 9 && hdr.ethernet.etherType == 0x0ecc) {  // a recirculated packet is NORMAL in egress
            meta.passes = 9;
            recirculate_preserving_field_list(1);
        }
    }
}

control CC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control D(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
    }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
