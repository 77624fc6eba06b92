//! Kubernetes' contract through the CRI (docs/guides/kubernetes.md):
//! the test bed's CRI client (`testbed/src/cri/`) drives a private containerd's CRI plugin
//! (Debian's 1.6: its own root, state, socket and config; host-network pods, no CNI; a pause
//! and a busybox image imported from tarballs) exactly as kubelet does, with the **shipped**
//! handler snippet (`hooks/containerd-config.toml`) as its `gpuhook` runtime and the handler
//! the shipped RuntimeClass names. Each test is one of the test bed's scenarios
//! (`testbed::cri::scenarios`, also run by `gpuhook-testbed cri scenarios` on a machine with
//! the package), on a fake GPU host of its own. `GPUHOOK_TEST_BIN`, `GPUHOOK_CRI_SNIPPET` and
//! `GPUHOOK_CRI_RUNTIMECLASS` run them against the installed binary and files.

mod common;

use std::path::Path;
use testbed::cri::bed::Files;
use testbed::cri::scenarios;

fn files() -> Files {
    common::require_root();
    Files::with(common::bin())
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
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
    gpu_pod_containers_get_their_gpus_and_the_sandbox_none,
    unmet_request_fails_start_container_and_reserves_nothing,
    init_containers_hold_gpus_while_they_run,
    share_process_namespace_pods_are_refused,
    every_removal_path_frees,
    default_handler_ignores_the_annotations,
    killed_behind_containerds_back_is_stale_and_reclaimed,
    attach_and_detach_by_cri_container_id,
    containerd_restarted_keeps_the_reservations,
    the_readme_pod_runs_as_written,
);

fn shipped(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("hooks")
            .join(name),
    )
    .unwrap()
}

/// CRI-O passes a pod annotation to the runtime only when the handler allows it: the shipped
/// snippet's `allowed_annotations` are exactly the request's keys.
#[test]
fn crio_snippet_allows_every_request_key() {
    let text = shipped("crio-gpuhook.conf");
    let line = text
        .lines()
        .find(|l| l.starts_with("allowed_annotations = "))
        .expect("allowed_annotations");
    let listed: Vec<String> = line
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let keys: Vec<String> = gpuhook::request::oci::KEYS
        .split(", ")
        .map(|k| format!("{}{k}", gpuhook::request::oci::ANNOTATION_PREFIX))
        .collect();
    assert_eq!(listed, keys, "{line}");
}

/// The README's Kubernetes section installs exactly the shipped files, from where the
/// packages put them, and shows the RuntimeClass as shipped.
#[test]
fn the_readme_kubernetes_section_uses_the_shipped_files() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let k8s = readme
        .split("\n## Kubernetes\n")
        .nth(1)
        .expect("a Kubernetes section")
        .split("\n## ")
        .next()
        .unwrap();
    for line in [
        "cat /usr/share/gpuhook/engines/containerd-config.toml >> /etc/containerd/config.toml",
        "kubectl apply -f /usr/share/gpuhook/engines/kubernetes-runtimeclass.yaml",
        "/usr/share/gpuhook/engines/crio-gpuhook.conf",
    ] {
        assert!(k8s.contains(line), "{line}");
    }
    let rc = shipped("kubernetes-runtimeclass.yaml");
    let body: String = rc
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(k8s.contains(&format!("```yaml\n{body}```")), "{body}");
    // The packages install them there.
    let cargo =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    for f in [
        "containerd-config.toml",
        "crio-gpuhook.conf",
        "kubernetes-runtimeclass.yaml",
    ] {
        assert!(
            cargo.contains(&format!(
                "[\"hooks/{f}\", \"usr/share/gpuhook/engines/\", \"644\"]"
            )),
            "deb: {f}"
        );
        assert!(
            cargo.contains(&format!(
                "{{ source = \"hooks/{f}\", dest = \"/usr/share/gpuhook/engines/{f}\", mode = \"644\" }}"
            )),
            "rpm: {f}"
        );
    }
}
