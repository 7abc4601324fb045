/*
 * limiter.p4: the boundary limiter a DPU (or a pod uplink shaper) runs.
 *
 * A bump in the wire between a host-facing port and an uplink port. Which
 * port forwards to which, and which meter/counter cell a crossing uses, are
 * table entries the control plane installs: with no entries, nothing crosses
 * (fail closed).
 *
 * Exemption is proved by where the device sits, never claimed by a frame:
 * a frame is intra-pod (exempt) only when the control plane has told this
 * device who its pod peers are (`pod_peers`: the MACs of the OTHER nodes of
 * its pod, installed only on node DPUs) and the frame is well-formed,
 * unfragmented IPv4 with source and destination in the pod, whose Ethernet
 * destination (leaving the node) or source (entering it) is such a peer. A
 * pod uplink has no peers: everything that crosses it is metered. Broadcast
 * and multicast never match a peer (peers are unicast), so they are metered.
 *
 * Sealing: the pod's switch, which delivers a frame to the peer its MAC
 * names, is the operator's, and could relay exempt frames out of the pod. So a
 * node DPU exempts a frame only through its crypto engine (`sealing`): an
 * intra-pod frame from the host, sent from the node's own MAC, leaves by the
 * seal port, where the engine encrypts and authenticates it under the pod's key
 * before it reaches the wire; an arriving frame is intra-pod only when it enters
 * on the seal port, where the engine puts only frames that authenticated under
 * that key, and is addressed to the node's own MAC. A frame
 * that arrives on the uplink port is metered whatever MAC and addresses it
 * carries. A node DPU with no seal port exempts nothing.
 *
 * ARP passes outside the cap's meter only when well formed (Ethernet/IPv4,
 * request or reply) and at most ARP_MAX_FRAME bytes long, through a small meter
 * of its own (cell ARP_CELLS + cell of boundary_meter) whose rate and burst the
 * control plane carves out of the cap, so the two meters together never pass
 * more than the cap. Without a valid lease, ARP passes (through the same meter)
 * only to or from a pod peer: a node's neighbour discovery inside its pod keeps
 * working when the lease lapses, and nothing else does.
 *
 * Everything else that crosses (IPv4 to or from other pods, IPv4 fragments,
 * malformed IPv4, IPv6, VLAN-tagged frames, oversized or malformed ARP, any
 * other EtherType) is metered against the cap of the crossing's cell with a
 * two-rate three-colour byte meter; red is dropped. IPv4 leaving the subject
 * (a crossing marked `inside`) with a source outside the pod's prefixes is
 * spoofed and dropped: forging another pod's source must not buy exemption at
 * that pod's ingress.
 *
 * Cells: the control plane gives each (subject, direction) a cell index,
 * subject being the pod or node this device limits and direction egress
 * (leaving the subject) or ingress (entering it). Counters are indexed
 * cell * 8 + class and cell * 8 + colour (0-2 the meter's, 3: over the window
 * budget, 4: no valid lease, 5: ARP over its own allowance). Every frame that
 * crosses is counted in exactly one class.
 *
 * Lease: metered traffic crosses only while the DPU holds a lease. The control
 * plane writes lease_cfg's default action lease(gen, deadline), deadline being a
 * time on the DPU's own clock (ingress_global_timestamp, us), and renews it with
 * a new generation and a later deadline well before it passes. At or after the
 * deadline, or with no lease, metered traffic is dropped and counted. A lease
 * thus ends at a time the control plane knows, whether or not any packet used
 * it: a DPU cut off from its controller falls to its floor by its own clock,
 * idle or not, at the latest when its last lease's deadline passes.
 *
 * Clock: to place a deadline on the DPU's clock, the control plane reads that
 * clock through packet I/O. A PacketOut (which enters on CPU_PORT, where no
 * wire port may be) carrying a nonce comes back at once as a PacketIn with the
 * nonce and the ingress timestamp it was seen at; it crosses nothing and is
 * counted nowhere. The target must run with its CPU port at CPU_PORT
 * (simple_switch_grpc --cpu-port 510).
 *
 * Epoch: a lease is valid only in the pipeline instance it was granted to. The
 * register lease_epoch starts at 0 when the pipeline is loaded or the device
 * restarts; the first echo that finds it 0 writes its `arm` there (so it is set
 * once per pipeline instance) and its own time into lease_armed_at, and every
 * echo reports the epoch it found and when it was armed. A lease carries the
 * epoch it was granted under and passes traffic only while lease_epoch holds
 * it: firmware that restores the lease entry with the program after a restart
 * (its deadline now far ahead on the restarted clock) passes nothing. Every
 * echo shows on the DPU's own clock how long ago this pipeline instance began,
 * so a controller holds back the lease of a DPU whose meters and window slots
 * started afresh until a window has passed since then, even when the reply to
 * the echo that armed it was lost or another controller armed it.
 *
 * Window mode (a window_cfg entry for the cell): besides the meter, at most
 * `budget` bytes pass in any interval of the window W. Time is cut into slots
 * of W/15 (slot = (timestamp_us >> 10) * mult >> 32, mult chosen by the
 * control plane) and a packet passes only if the bytes of the current slot and
 * the 15 before it, plus its own, stay within the budget: any interval of
 * length W lies within 16 consecutive slots, so the bound is exact, with 64-bit
 * counters (budgets far above 4 GiB).
 */
#include <core.p4>
#include <v1model.p4>

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_ARP  = 0x0806;
#define CPU_PORT 510  // the target's CPU port: PacketOuts enter here, PacketIns leave here

// Traffic classes, the low 3 bits of a class_counter index.
const bit<3> CLASS_INTRA    = 0;  // IPv4 between this node and a pod peer, both addresses in the pod: exempt
const bit<3> CLASS_ARP      = 1;  // well-formed, minimum-size ARP: its own small meter
const bit<3> CLASS_IPV4     = 2;  // any other well-formed, unfragmented IPv4: metered
const bit<3> CLASS_FRAGMENT = 3;  // IPv4 fragments: metered
const bit<3> CLASS_OTHER    = 4;  // malformed IPv4 or ARP, every other EtherType: metered
const bit<3> CLASS_SPOOFED  = 5;  // IPv4 from inside with a source outside the pod: dropped

#define MAX_CELLS 256
#define ARP_CELLS 256   // boundary_meter cells from here on are the ARP meters, one per cell
#define NSLOT 16
const bit<32> ARP_MAX_FRAME = 60;  // an Ethernet/IPv4 ARP frame padded to the minimum frame, no FCS
const bit<2> COLOR_WINDOW = 3;  // over the window budget: dropped
const bit<3> CODE_LEASE = 4;    // colour-counter code of traffic without a valid lease: dropped
const bit<3> CODE_ARP_RED = 5;  // colour-counter code of ARP over its own allowance: dropped

// The clock echo (see "Clock" above): the controller's nonce, and the nonce with the DPU's time.
@controller_header("packet_out")
header packet_out_t {
    bit<64> nonce;
    bit<64> arm;    // the lease epoch to set, if none is (a fresh random value, never 0)
}

@controller_header("packet_in")
header packet_in_t {
    bit<64> nonce;
    bit<48> now;
    bit<64> epoch;     // lease_epoch as this echo found it (before any arm)
    bit<48> armed_at;  // when lease_epoch was armed, on the DPU's clock (this echo's time if it armed it)
}

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

header arp_t {
    bit<16> htype;
    bit<16> ptype;
    bit<8>  hlen;
    bit<8>  plen;
    bit<16> oper;
    bit<48> sha;
    bit<32> spa;
    bit<48> tha;
    bit<32> tpa;
}

struct headers_t {
    packet_in_t  packet_in;
    packet_out_t packet_out;
    ethernet_t ethernet;
    ipv4_t     ipv4;
    arp_t      arp;
}

struct metadata_t {
    bit<32> cell;
    bit<1>  inside;
    bit<3>  class;
    bit<2>  color;
    bit<1>  window_on;
    bit<64> budget;
    bit<64> mult;
    bit<1>  lease_on;
    bit<48> lease_deadline;
    bit<64> lease_epoch;
    bit<48> peer_mac;   // the Ethernet address that must be a pod peer for exemption
    bit<1>  seal_out;   // from the host: intra-pod frames leave by seal_port, to the crypto engine
    bit<9>  seal_port;
    bit<1>  sealed_in;  // arrived from the crypto engine: authenticated under the pod's key
    bit<48> node_mac;   // this node's own MAC: the source of what it seals, the destination of what it opens
}

parser LimiterParser(packet_in packet, out headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t standard_metadata) {
    state start {
        transition select(standard_metadata.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_ethernet;
        }
    }
    state parse_packet_out {
        packet.extract(hdr.packet_out);
        transition accept;
    }
    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: parse_ipv4;
            ETHERTYPE_ARP: parse_arp;
            default: accept;
        }
    }
    state parse_arp {
        packet.extract(hdr.arp);
        transition accept;
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition accept;
    }
}

control LimiterVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

// One slot of the window: counted when it belongs to the current slot or one of the 15 before it.
#define SLOT(i) \
    slot_epoch.read(e, base + i); \
    slot_bytes.read(b, base + i); \
    if (epoch - e < NSLOT) { sum = sum + b; }

control LimiterIngress(inout headers_t hdr, inout metadata_t meta,
                       inout standard_metadata_t standard_metadata) {
    counter(MAX_CELLS * 8, CounterType.packets_and_bytes) class_counter;
    counter(MAX_CELLS * 8, CounterType.packets_and_bytes) color_counter;
    meter(ARP_CELLS + MAX_CELLS, MeterType.bytes) boundary_meter;  // cells, then their ARP meters
    register<bit<64>>(MAX_CELLS * NSLOT) slot_epoch;
    register<bit<64>>(MAX_CELLS * NSLOT) slot_bytes;
    register<bit<64>>(1) lease_epoch;  // see "Epoch" above
    register<bit<48>>(1) lease_armed_at;

    action drop() {
        mark_to_drop(standard_metadata);
    }

    action cross(bit<9> port, bit<32> cell, bit<1> inside) {
        standard_metadata.egress_spec = port;
        meta.cell = cell;
        meta.inside = inside;
    }

    // Which port a frame arriving on ingress_port leaves by, its cell, and whether it comes from
    // inside the subject (the host side), where IPv4 sources must be the pod's own.
    table boundary {
        key = { standard_metadata.ingress_port: exact; }
        actions = { cross; drop; }
        default_action = drop();
        size = 64;
    }

    action window(bit<64> budget, bit<64> mult) {
        meta.window_on = 1;
        meta.budget = budget;
        meta.mult = mult;
    }

    // Window mode per cell: the budget (bytes per window) and the slot multiplier.
    table window_cfg {
        key = { meta.cell: exact; }
        actions = { window; NoAction; }
        default_action = NoAction();
        size = MAX_CELLS;
    }

    // gen names the lease for the control plane's read-back; the data plane needs the deadline and epoch.
    action lease(bit<32> gen, bit<48> deadline, bit<64> epoch) {
        meta.lease_on = 1;
        meta.lease_deadline = deadline;
        meta.lease_epoch = epoch;
    }

    // Keyless: the control plane writes (and renews) its default action.
    table lease_cfg {
        actions = { lease; NoAction; }
        default_action = NoAction();
    }

    table src_in_pod {
        key = { hdr.ipv4.srcAddr: lpm; }
        actions = { NoAction; }
        default_action = NoAction();
        size = 1024;
    }

    table dst_in_pod {
        key = { hdr.ipv4.dstAddr: lpm; }
        actions = { NoAction; }
        default_action = NoAction();
        size = 1024;
    }

    // The MACs of the other nodes of this node's pod (empty on a pod uplink: nothing is exempt there).
    table pod_peers {
        key = { meta.peer_mac: exact; }
        actions = { NoAction; }
        default_action = NoAction();
        size = 1024;
    }

    action seal_via(bit<9> port, bit<48> node_mac) {
        meta.seal_out = 1;
        meta.seal_port = port;
        meta.node_mac = node_mac;
    }

    action opened(bit<48> node_mac) {
        meta.sealed_in = 1;
        meta.node_mac = node_mac;
    }

    // A node DPU's crypto engine, by ingress port: on the host port, seal_via(the seal port, the node's
    // MAC); on the seal port, opened(the node's MAC). No entry: nothing arriving on that port can be
    // intra-pod. The node's own MAC must be the source of a frame it seals (the engine leaves the MACs in
    // the clear: any other source would be six bytes of the host's choosing carried out readable by a
    // switch that relays the frame) and the destination of one it opened (a frame for another node,
    // relayed here, is not this node's intra-pod traffic).
    table sealing {
        key = { standard_metadata.ingress_port: exact; }
        actions = { seal_via; opened; NoAction; }
        default_action = NoAction();
        size = 64;
    }

    apply {
        if (hdr.packet_out.isValid()) {
            // The clock echo: back to the controller at once, with the time it was seen.
            hdr.packet_in.setValid();
            hdr.packet_in.nonce = hdr.packet_out.nonce;
            hdr.packet_in.now = standard_metadata.ingress_global_timestamp;
            lease_epoch.read(hdr.packet_in.epoch, 0);
            if (hdr.packet_in.epoch == 0) {
                lease_epoch.write(0, hdr.packet_out.arm);  // armed once per pipeline instance
                lease_armed_at.write(0, standard_metadata.ingress_global_timestamp);
            }
            lease_armed_at.read(hdr.packet_in.armed_at, 0);
            hdr.packet_out.setInvalid();
            standard_metadata.egress_spec = CPU_PORT;
        } else if (boundary.apply().hit) {
            bool pod_addresses = false;  // IPv4 with source and destination in the pod
            if (hdr.arp.isValid() && hdr.arp.htype == 1 && hdr.arp.ptype == ETHERTYPE_IPV4
                    && hdr.arp.hlen == 6 && hdr.arp.plen == 4 && (hdr.arp.oper == 1 || hdr.arp.oper == 2)
                    && standard_metadata.packet_length <= ARP_MAX_FRAME) {
                meta.class = CLASS_ARP;
            } else if (hdr.ipv4.isValid() && hdr.ipv4.version == 4 && hdr.ipv4.ihl >= 5) {
                bool src_inside = src_in_pod.apply().hit;
                if (meta.inside == 1 && !src_inside) {
                    meta.class = CLASS_SPOOFED;
                } else if ((hdr.ipv4.flags & 1) != 0 || hdr.ipv4.fragOffset != 0) {
                    meta.class = CLASS_FRAGMENT;
                } else {
                    meta.class = CLASS_IPV4;
                    if (src_inside) {
                        pod_addresses = dst_in_pod.apply().hit;
                    }
                }
            } else {
                meta.class = CLASS_OTHER;
            }
            // Whether the frame goes to (leaving the node) or comes from (entering it) a pod peer.
            // One lookup for every class: a table is applied once in the pipeline.
            bool to_peer = false;
            if (meta.class == CLASS_ARP || pod_addresses) {
                if (meta.inside == 1) {
                    meta.peer_mac = hdr.ethernet.dstAddr;
                } else {
                    meta.peer_mac = hdr.ethernet.srcAddr;
                }
                to_peer = pod_peers.apply().hit;
            }
            if (pod_addresses && to_peer) {
                sealing.apply();
                if (meta.inside == 1 && meta.seal_out == 1 && hdr.ethernet.srcAddr == meta.node_mac) {
                    meta.class = CLASS_INTRA;
                    standard_metadata.egress_spec = meta.seal_port;  // sealed before it reaches the wire
                } else if (meta.inside == 0 && meta.sealed_in == 1 && hdr.ethernet.dstAddr == meta.node_mac) {
                    meta.class = CLASS_INTRA;
                }
            }
            class_counter.count((meta.cell << 3) | (bit<32>)meta.class);
            if (meta.class == CLASS_SPOOFED) {
                mark_to_drop(standard_metadata);
            } else if (meta.class != CLASS_INTRA) {
                bool leased = false;
                lease_cfg.apply();
                if (meta.lease_on == 1) {
                    bit<64> epoch_now;
                    lease_epoch.read(epoch_now, 0);
                    leased = standard_metadata.ingress_global_timestamp < meta.lease_deadline
                             && epoch_now == meta.lease_epoch;
                }
                if (meta.class == CLASS_ARP) {
                    // Without a lease ARP still passes between pod mates (a node's neighbour discovery
                    // inside its pod keeps its intra-pod traffic going), never to anyone else.
                    if (leased || to_peer) {
                        boundary_meter.execute_meter(ARP_CELLS + meta.cell, meta.color);
                        if (meta.color == V1MODEL_METER_COLOR_RED) {
                            color_counter.count((meta.cell << 3) | (bit<32>)CODE_ARP_RED);
                            mark_to_drop(standard_metadata);
                        }
                    } else {
                        color_counter.count((meta.cell << 3) | (bit<32>)CODE_LEASE);
                        mark_to_drop(standard_metadata);
                    }
                } else if (leased) {
                    boundary_meter.execute_meter(meta.cell, meta.color);
                    if (meta.color != V1MODEL_METER_COLOR_RED) {
                        window_cfg.apply();
                        if (meta.window_on == 1) {
                            bit<64> epoch = (((bit<64>)(standard_metadata.ingress_global_timestamp >> 10)) * meta.mult) >> 32;
                            bit<32> base = meta.cell << 4;
                            bit<64> sum = 0;
                            bit<64> e;
                            bit<64> b;
                            SLOT(0) SLOT(1) SLOT(2) SLOT(3) SLOT(4) SLOT(5) SLOT(6) SLOT(7)
                            SLOT(8) SLOT(9) SLOT(10) SLOT(11) SLOT(12) SLOT(13) SLOT(14) SLOT(15)
                            bit<64> len = (bit<64>)standard_metadata.packet_length;
                            if (sum + len > meta.budget) {
                                meta.color = COLOR_WINDOW;
                            } else {
                                bit<32> idx = base + (bit<32>)(epoch & (NSLOT - 1));
                                slot_epoch.read(e, idx);
                                slot_bytes.read(b, idx);
                                if (e == epoch) {
                                    b = b + len;
                                } else {
                                    b = len;
                                }
                                slot_epoch.write(idx, epoch);
                                slot_bytes.write(idx, b);
                            }
                        }
                    }
                    color_counter.count((meta.cell << 3) | (bit<32>)meta.color);
                    if (meta.color == V1MODEL_METER_COLOR_RED || meta.color == COLOR_WINDOW) {
                        mark_to_drop(standard_metadata);
                    }
                } else {
                    color_counter.count((meta.cell << 3) | (bit<32>)CODE_LEASE);
                    mark_to_drop(standard_metadata);
                }
            }
        }
    }
}

control LimiterEgress(inout headers_t hdr, inout metadata_t meta,
                      inout standard_metadata_t standard_metadata) {
    apply { }
}

control LimiterComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control LimiterDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.packet_in);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.arp);
    }
}

V1Switch(LimiterParser(), LimiterVerifyChecksum(), LimiterIngress(), LimiterEgress(),
         LimiterComputeChecksum(), LimiterDeparser()) main;
