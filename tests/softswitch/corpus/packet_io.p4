/* packet_io.p4: packet-in and packet-out through the CPU port (64, simple_switch_grpc's --cpu-port).
 * The controller headers are not byte-aligned field by field, so PI's bit packing shows. The punt
 * table sends some EtherTypes to the CPU with a packet_in header (ingress port, reason), one without
 * it (PI then takes the frame's first two bytes for the metadata), forwards or drops the rest. A
 * frame from the CPU port carries packet_out: it leaves on the port its metadata names, with its
 * EtherType rewritten when the tag bit is set. */
#include <core.p4>
#include <v1model.p4>

const bit<9> CPU_PORT = 64;

@controller_header("packet_in")
header packet_in_t {
    bit<9> ingress_port;
    bit<3> reason;
    bit<4> _pad;
}

@controller_header("packet_out")
header packet_out_t {
    bit<9> egress_port;
    bit<1> tag;
    bit<6> _pad;
}

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

struct headers_t {
    packet_out_t packet_out;
    packet_in_t  packet_in;
    ethernet_t   ethernet;
}

struct metadata_t { }

parser P(packet_in packet, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    state start {
        transition select(sm.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_ethernet;
        }
    }
    state parse_packet_out {
        packet.extract(hdr.packet_out);
        transition parse_ethernet;
    }
    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control I(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    action to_cpu(bit<3> reason) {
        sm.egress_spec = CPU_PORT;
        hdr.packet_in.setValid();
        hdr.packet_in.ingress_port = sm.ingress_port;
        hdr.packet_in.reason = reason;
    }
    action to_cpu_bare() {
        sm.egress_spec = CPU_PORT;
    }
    action fwd(bit<9> port) {
        sm.egress_spec = port;
    }
    action drop() {
        mark_to_drop(sm);
    }
    table punt {
        key = { hdr.ethernet.etherType: exact; }
        actions = { to_cpu; to_cpu_bare; fwd; drop; }
        default_action = drop();
    }
    apply {
        if (hdr.packet_out.isValid()) {
            sm.egress_spec = hdr.packet_out.egress_port;
            if (hdr.packet_out.tag == 1) {
                hdr.ethernet.etherType = 0x88B5;
            }
            hdr.packet_out.setInvalid();
        } else {
            punt.apply();
        }
    }
}

control E(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) { apply { } }

control CC(inout headers_t hdr, inout metadata_t meta) { apply { } }

control D(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.packet_in);
        packet.emit(hdr.ethernet);
    }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
