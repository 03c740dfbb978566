"""Every test module's lane: what it needs to run, and so how fast it is.

    protocol  the pure machines (snapmesh/protocol, snapmesh/app, the simulator and fuzzer over them)
    checking  the pure checks (checking/, trace judgement, the layer and docs rules)
    shells    one shell or tool in-process: no cluster, no Spark, no Docker
    cluster   real node and controller processes over real sockets
    spark     a real Spark session
    deploy    the Docker engine, the wheel in a fresh venv, Helm, Terraform
    hosts     network namespaces (root)

conftest.py marks each test with its lane (`pytest -m protocol`); `make test-pure` runs
the protocol and checking lanes. A new test module gets a lane here, or the suite fails
(tests/test_lanes.py). The folders tests/<lane>/ will follow these names.
"""

LANES: dict[str, str] = {
    "protocol": """
        app_snapshots chunk_budget controller_machine controller_tracker core_finished_window core_transitions
        fault_fuzz fault_fuzz_apps invariants_complete link node_app node_machine overtake_merge request_window
        restore_gate restore_machine tracker_assembly wal
    """,
    "checking": """
        cut docs_index lanes layers log_checker log_checker_index sim_properties trace_judgement
    """,
    "shells": """
        app_frames bench_dispatch bench_results cli_flags cli_help_walk cluster_file_doc config controller_engine_loop
        controller_export controller_journal controller_store core_refusals datalock flag_names_in_use node_channels
        perf_paths restore_taken_back described snapshot_file tls_hints tracker_retention ui_model
    """,
    "cluster": """
        app_cluster app_contract app_submit app_workload batch_yields bench_phases bench_utilisation broadcast_trigger
        channel_runs chaos chaos_app cli_find_controller cluster cluster_data_dir controller_admission
        controller_restart controller_service controller_working_set data_safety demo_in_flight event_loop
        grpc_metrics health_port hybrid_mode kvshard launcher list_bounds metrics node_cluster node_failure_modes
        node_faults node_main node_recovery_failures node_translog paging_grpcurl readme_grpcurl report_save_order
        restore_cluster restore_keys_cluster review_cluster review_tls security sim_cli_errors sim_scenarios
        snapshot_cli snapshot_watch_table store_and_ids supervisor token_ring_app trace ui_bounds ui_browser ui_cli
        watch_queue
    """,
    "spark": """
        reconcile_app_checks reconcile_app_cluster reconcile_cds reconcile_cli reconcile_cluster reconcile_segments
        reconcile_standalone reconcile_transforms spark_agrees_with_cut torn_line
    """,
    "deploy": """
        alert_rules ci_workflow compose compose_v2 dashboard helm_chart helm_conventions helm_pods package reconcile_compose swarm
        swarm_stack terraform terraform_instances wheel wheel_app
    """,
    "hosts": """
        bench_hosts chaos_hosts hosts
    """,
}

PURE = ("protocol", "checking")


def lane_of() -> dict[str, str]:
    """module name (test_x) -> its lane."""
    return {f"test_{name}": lane for lane, names in LANES.items() for name in names.split()}
