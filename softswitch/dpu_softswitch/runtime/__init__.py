"""The P4Runtime side of a device: P4Info bound to a compiled program, and its entities.

pipeline.Pipeline is what SetForwardingPipelineConfig installs; it dispatches each Write update and
Read entity by kind to the module named after that kind (table_entry, meter_entry, counter_entry,
direct_counter_entry, direct_meter_entry, register_entry, value_set_entry,
packet_replication_engine_entry, action_profile_member, action_profile_group, digest_entry).
binding holds the P4Info-to-JSON binding they share; digests, packetio and profile_mgr model PI's
digest manager, packet I/O metadata and action profile manager.

Semantics follow the P4Runtime specification as simple_switch_grpc's server answers it:
canonical or zero-padded byte strings, value-in-range checks, LPM/ternary masks with no
stray bits, priority required exactly for TCAM-like tables, duplicate INSERT -> ALREADY_EXISTS,
MODIFY/DELETE of a missing entry -> NOT_FOUND, const tables and const default actions refused.
"""
