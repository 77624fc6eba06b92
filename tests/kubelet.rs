//! Kubernetes' device plugin (`gpuhook device-plugin`) as kubelet meets it: the test bed's
//! kubelet stand-in (`testbed/src/kubelet/`) serves kubelet's `Registration` and pod
//! resources sockets, calls the plugin as kubelet's device manager does, and runs pods
//! through a private containerd 1.6's CRI plugin (the shipped gpuhook handler), passing
//! `Allocate`'s answer into `CreateContainer` as kubelet does. Each test is one of the test
//! bed's scenarios (`testbed::kubelet::scenarios`, also run by `gpuhook-testbed kubelet
//! scenarios` on a machine with the package: the Debian 13 VM's containerd 1.7), on a fake
//! GPU host of its own. `GPUHOOK_TEST_BIN` and `GPUHOOK_DEVICE_PLUGIN` run them against
//! other binaries.

mod common;

use testbed::kubelet::bed::Files;
use testbed::kubelet::scenarios;

fn files() -> Files {
    common::require_root();
    let f = Files::with(common::bin());
    // The plugin is another package's binary: `cargo build --workspace` makes it.
    let plugin = std::path::Path::new(&f.plugin[0]);
    assert!(
        plugin.is_file() && plugin.file_name().is_some_and(|n| n == "gpuhook-device-plugin"),
        "{:?}: no gpuhook-device-plugin beside the gpuhook under test (cargo build --workspace first, or set GPUHOOK_DEVICE_PLUGIN)",
        f.plugin
    );
    f
}

/// One bed at a time: the scenarios time the plugin's answers (1 s, 5 s, 10 s) on a
/// machine of two cores.
static ONE_BED: std::sync::Mutex<()> = std::sync::Mutex::new(());

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let _one = ONE_BED.lock().unwrap_or_else(|e| e.into_inner());
                scenarios::$name(&files());
            }
        )*
        /// Every scenario of the test bed is a test here.
        #[test]
        fn every_scenario_is_a_test() {
            let here = [$(stringify!($name)),*];
            let bed: Vec<&str> = scenarios::SCENARIOS.iter().map(|(n, _)| *n).collect();
            assert_eq!(here.to_vec(), bed);
        }
    };
}

scenarios!(
    every_resource_registers_with_ids_and_numa,
    a_gpu_pod_gets_exactly_its_gpu_with_and_without_the_runtime_class,
    mig_and_shared_pods_get_their_units,
    health_follows_a_libvirt_domain_and_a_podman_container,
    quarantine_and_recovery,
    allocate_races_a_libvirt_prepare_for_the_last_gpu,
    kubelet_restarted_the_plugin_registers_again_and_keeps_the_pool,
    plugin_restarted_loses_nothing,
    a_pod_deleted_before_its_container_frees_through_pod_resources,
    a_pod_deleted_before_its_container_frees_through_the_checkpoint,
    a_corrupt_state_file_makes_no_device_healthy,
);
