//! Allocation's tests, and the fake GPUs other modules' tests use.

use super::error::AllocError;
use super::held::{busy, gi_holder, sharers, slots_of, Held};
use super::whole::allocate;
use crate::host::inventory::Gpu;
use crate::host::inventory::Role;
use crate::ids::Vendor;
use crate::ids::{Pci, Unit};
use crate::request::extra_specs::Op;
use crate::request::Capabilities;
use crate::request::{DeviceSel, Field, Filter, MigSel, Request, Wording};

pub(crate) fn gpu(
    index: usize,
    numa: Option<u32>,
    parent: &str,
    vendor: Vendor,
    arch: &str,
) -> Gpu {
    Gpu {
        index,
        pci: format!("0000:{:02x}:00.0", 0x10 + index).parse().unwrap(),
        vendor,
        vendor_id: 0x10de,
        device_id: 0x2330,
        model: format!("Model {arch}"),
        arch: Some(arch.into()),
        uuid: Some(format!("GPU-{index:08}")),
        numa_node: numa,
        parent: Some(parent.into()),
        nodes: vec![(
            Role::Nvidia,
            crate::host::inventory::DevNode {
                node: crate::node::Node::new(format!("/dev/nvidia{index}"), 195, index as u32),
                mode: 0o666,
            },
        )],
        excluded: false,
        problem: None,
        pending: false,
        driver: Some("nvidia".into()),
        migs: vec![],
        link: None,
        sharing: None,
    }
}

/// 8 GPUs, 2 NUMA nodes, 2 GPUs per PCIe switch (DGX-like).
pub(crate) fn dgx() -> Vec<Gpu> {
    (0..8)
        .map(|i| {
            gpu(
                i,
                Some((i / 4) as u32),
                &format!("sw{}", i / 2),
                Vendor::Nvidia,
                "hopper",
            )
        })
        .collect()
}

pub(crate) fn req(count: u32) -> Request {
    Request {
        count,
        filters: vec![],
        devices: vec![],
        capabilities: Capabilities::default(),
        mode: None,
        uid: 0,
        gid: 0,
        mig: false,
        migs: vec![],
        driver: None,
        share: false,
    }
}

fn idx(gpus: &[Gpu], units: &[Unit]) -> Vec<usize> {
    units
        .iter()
        .map(|p| gpus.iter().find(|g| g.pci == p.pci()).unwrap().index)
        .collect()
}

fn hold(h: &mut Held, gpus: &[Gpu], units: &[Unit], who: &str) {
    let _ = gpus;
    for p in units {
        h.insert(*p, format!("domain '{who}'"));
    }
}

/// The unit of this name.
pub(crate) fn unit(s: &str) -> Unit {
    s.parse().unwrap()
}

fn pci(s: &str) -> Pci {
    s.parse().unwrap()
}

/// `/dev/nvidia-caps/nvidia-cap<m>` as a test host has it.
pub(crate) fn cap_node(m: u32) -> crate::host::inventory::DevNode {
    crate::host::inventory::DevNode {
        node: crate::node::Node::new(format!("/dev/nvidia-caps/nvidia-cap{m}"), 236, m),
        mode: 0o444,
    }
}

/// `g` in MIG mode with these (gi, ci) instances (capability minors `gi*9`, `gi*9+1+ci`).
pub(crate) fn with_migs(mut g: Gpu, layout: &[(u32, u32)]) -> Gpu {
    g.migs = layout
        .iter()
        .map(|&(gi, ci)| crate::host::inventory::Mig {
            gi,
            ci,
            gi_cap: cap_node(gi * 9),
            ci_cap: cap_node(gi * 9 + 1 + ci),
        })
        .collect();
    g
}

#[test]
fn mig_instances_packed_and_never_whole() {
    let mut gs = dgx();
    gs[0] = with_migs(gs[0].clone(), &[(7, 0), (8, 0), (9, 0)]);
    gs[1] = with_migs(gs[1].clone(), &[(1, 0), (2, 0)]);
    let mut held = Held::new();
    let mut r = req(2);
    r.mig = true;
    // Best fit: the GPU whose free instances just suffice.
    assert_eq!(
        allocate(&gs, &held, &r).unwrap(),
        ["0000:11:00.0/gi1/ci0", "0000:11:00.0/gi2/ci0"]
    );
    held.insert(unit("0000:11:00.0/gi1/ci0"), "domain 'x'".into());
    assert_eq!(
        allocate(&gs, &held, &r).unwrap(),
        ["0000:10:00.0/gi7/ci0", "0000:10:00.0/gi8/ci0"]
    );
    // Four: none suffices alone; the fullest first.
    r.count = 4;
    assert_eq!(allocate(&gs, &held, &r).unwrap().len(), 4);
    r.count = 5;
    assert!(allocate(&gs, &held, &r).unwrap_err().to_string().contains(
        "only 4 of the host's 5 MIG instances on matching GPUs are free: held by domain 'x'"
    ));
    // Whole GPUs: never one with instances, nor one whose instance is held.
    assert_eq!(busy(&held, pci("0000:11:00.0")), Some("domain 'x'"));
    assert_eq!(busy(&held, pci("0000:10:00.0")), None);
    assert_eq!(busy(&held, pci("0000:11:00.1")), None);
    let whole = allocate(&gs, &held, &req(6)).unwrap();
    assert!(!whole.contains(&unit("0000:10:00.0")) && !whole.contains(&unit("0000:11:00.0")));
    assert!(allocate(&gs, &held, &req(7))
        .unwrap_err()
        .to_string()
        .contains("2 in MIG mode"));
    // A GPU held whole gives no instance.
    held.insert(unit("0000:10:00.0"), "domain 'w'".into());
    r.count = 1;
    r.migs = vec![crate::request::MigSel {
        gpu: DeviceSel::Index(0),
        gi: 7,
        ci: 0,
    }];
    assert!(allocate(&gs, &held, &r)
        .unwrap_err()
        .to_string()
        .contains("is held whole by domain 'w'"));
}

/// Compute instances of one GPU instance share its memory, engines and fault domain: one
/// holder at a time (it may take several of them), another GPU instance is another unit.
#[test]
fn one_gpu_instance_serves_one_holder() {
    let mut gs = dgx();
    gs[0] = with_migs(gs[0].clone(), &[(7, 0), (7, 1), (8, 0)]);
    let id = |gi: u32, ci: u32| Unit::Mig {
        pci: pci("0000:10:00.0"),
        gi,
        ci,
    };
    let exact = |sels: &[(u32, u32)]| {
        let mut r = req(sels.len() as u32);
        r.mig = true;
        r.migs = sels
            .iter()
            .map(|&(gi, ci)| crate::request::MigSel {
                gpu: DeviceSel::Index(0),
                gi,
                ci,
            })
            .collect();
        r
    };
    let mut held = Held::new();
    held.insert(id(7, 0), "domain 'a'".into());
    assert_eq!(
        gi_holder(&held, pci("0000:10:00.0"), 7),
        Some((id(7, 0), "domain 'a'"))
    );
    assert_eq!(gi_holder(&held, pci("0000:10:00.0"), 8), None);
    // An exact request for the other compute instance of gi 7: refused, naming 'a'.
    assert_eq!(
        allocate(&gs, &held, &exact(&[(7, 1)])).unwrap_err().to_string(),
        "0000:10:00.0/gi7/ci1 (MIG index 0 gi 7 ci 1): its GPU instance gi 7 is held by domain 'a' (through 0000:10:00.0/gi7/ci0); compute instances of one GPU instance share its memory and engines"
    );
    assert_eq!(allocate(&gs, &held, &exact(&[(8, 0)])).unwrap(), [id(8, 0)]);
    // Packed: never gi7/ci1; of two asked only one is free.
    let mut r = req(1);
    r.mig = true;
    assert_eq!(allocate(&gs, &held, &r).unwrap(), [id(8, 0)]);
    r.count = 2;
    let e = allocate(&gs, &held, &r).unwrap_err();
    assert!(
        e.to_string().contains(
            "only 1 of the host's 3 MIG instances on matching GPUs is free: held by domain 'a'"
        ),
        "{e}"
    );
    // One holder may take both compute instances of one GPU instance, packed or exact.
    let none = Held::new();
    assert_eq!(allocate(&gs, &none, &r).unwrap(), [id(7, 0), id(7, 1)]);
    assert_eq!(
        allocate(&gs, &none, &exact(&[(7, 0), (7, 1)])).unwrap(),
        [id(7, 0), id(7, 1)]
    );
    // gi 1 is not gi 17's prefix.
    let mut g17 = dgx();
    g17[0] = with_migs(g17[0].clone(), &[(1, 0), (17, 0)]);
    let mut h17 = Held::new();
    h17.insert(unit("0000:10:00.0/gi17/ci0"), "domain 'b'".into());
    assert_eq!(gi_holder(&h17, pci("0000:10:00.0"), 1), None);
    h17.insert(unit("0000:10:00.0/gi10/ci0"), "domain 'c'".into());
    h17.insert(unit("0000:10:00.0/gi1/ci3"), "domain 'd'".into());
    assert_eq!(
        gi_holder(&h17, pci("0000:10:00.0"), 1),
        Some((unit("0000:10:00.0/gi1/ci3"), "domain 'd'"))
    );
    h17.remove(&unit("0000:10:00.0/gi1/ci3"));
    h17.remove(&unit("0000:10:00.0/gi10/ci0"));
    r.count = 1;
    assert_eq!(allocate(&g17, &h17, &r).unwrap(), ["0000:10:00.0/gi1/ci0"]);
}

#[test]
fn exact_count_and_determinism() {
    let g = dgx();
    let a = allocate(&g, &Held::new(), &req(2)).unwrap();
    assert_eq!(a, allocate(&g, &Held::new(), &req(2)).unwrap());
    assert_eq!(idx(&g, &a), vec![0, 1], "one switch pair on NUMA 0");
    for n in 1..=8 {
        assert_eq!(
            allocate(&g, &Held::new(), &req(n)).unwrap().len(),
            n as usize
        );
    }
    let e = allocate(&g, &Held::new(), &req(9)).unwrap_err();
    assert!(
        e.to_string()
            .contains("only 8 of the host's 8 matching GPUs are free"),
        "{e}"
    );
}

#[test]
fn numa_best_fit_keeps_nodes_whole() {
    let g = dgx();
    let mut h = Held::new();
    let a = allocate(&g, &h, &req(1)).unwrap();
    assert_eq!(idx(&g, &a), vec![0]);
    hold(&mut h, &g, &a, "one");
    // A 4-GPU request fits only NUMA 1 now.
    let b = allocate(&g, &h, &req(4)).unwrap();
    assert_eq!(idx(&g, &b), vec![4, 5, 6, 7]);
    hold(&mut h, &g, &b, "four");
    // A single GPU goes next to the used one: switch 0's remaining GPU (best fit).
    let c = allocate(&g, &h, &req(1)).unwrap();
    assert_eq!(idx(&g, &c), vec![1]);
    hold(&mut h, &g, &c, "another");
    // A pair gets a whole switch.
    let d = allocate(&g, &h, &req(2)).unwrap();
    assert_eq!(idx(&g, &d), vec![2, 3]);
}

#[test]
fn pair_prefers_whole_switch_over_split() {
    let g = dgx();
    let mut h = Held::new();
    h.insert(Unit::Gpu(g[0].pci), "x".into());
    h.insert(Unit::Gpu(g[2].pci), "y".into());
    // NUMA 0 has 1 and 3 free (on different switches), NUMA 1 has 4 free: a whole switch
    // on NUMA 1 beats a split pair on the tighter node 0.
    let a = allocate(&g, &h, &req(2)).unwrap();
    assert_eq!(idx(&g, &a), vec![4, 5]);
    // Only NUMA 0 left for a pair: split across its switches rather than across nodes.
    h.insert(Unit::Gpu(g[4].pci), "p".into());
    h.insert(Unit::Gpu(g[6].pci), "q".into());
    let a = allocate(&g, &h, &req(2)).unwrap();
    assert_eq!(idx(&g, &a), vec![1, 3]);
    h.remove(&Unit::Gpu(g[4].pci));
    h.remove(&Unit::Gpu(g[6].pci));
    h.insert(Unit::Gpu(g[5].pci), "z".into());
    // Now NUMA 1 has 3 free: {4} on sw2 and {6,7} on sw3; NUMA 0 has {1,3}: 2 free, best fit.
    let a = allocate(&g, &h, &req(3)).unwrap();
    assert_eq!(idx(&g, &a), vec![4, 6, 7]);
}

#[test]
fn spreads_when_no_node_suffices() {
    let g = dgx();
    let mut h = Held::new();
    h.insert(Unit::Gpu(g[0].pci), "x".into());
    let a = allocate(&g, &h, &req(6)).unwrap();
    // NUMA 1 whole, then a pair from node 0 that shares a switch (2,3), not 1 and 2.
    assert_eq!(idx(&g, &a), vec![2, 3, 4, 5, 6, 7]);
}

#[test]
fn filters_vendor_arch_model() {
    let g = vec![
        gpu(0, Some(0), "a", Vendor::Nvidia, "fermi"),
        gpu(1, Some(0), "a", Vendor::Amd, "cdna2"),
        gpu(2, Some(0), "a", Vendor::Intel, "xe-hpc"),
        gpu(3, Some(0), "a", Vendor::Nvidia, "kepler"),
    ];
    let mut r = req(1);
    r.filters = vec![Filter {
        field: Field::Vendor,
        op: Op::Eq("amd".into()),
    }];
    assert_eq!(idx(&g, &allocate(&g, &Held::new(), &r).unwrap()), vec![1]);
    r.filters = vec![Filter {
        field: Field::Arch,
        op: Op::Eq("kepler".into()),
    }];
    assert_eq!(idx(&g, &allocate(&g, &Held::new(), &r).unwrap()), vec![3]);
    r.filters = vec![Filter {
        field: Field::Arch,
        op: Op::OneOf(vec!["xe-hpc".into(), "kepler".into()]),
    }];
    r.count = 2;
    assert_eq!(
        idx(&g, &allocate(&g, &Held::new(), &r).unwrap()),
        vec![2, 3]
    );
    r.filters = vec![Filter {
        field: Field::Model,
        op: Op::Contains("fermi".into()),
    }];
    r.count = 1;
    assert_eq!(idx(&g, &allocate(&g, &Held::new(), &r).unwrap()), vec![0]);
    r.filters = vec![Filter {
        field: Field::Arch,
        op: Op::Eq("hopper".into()),
    }];
    let e = allocate(&g, &Held::new(), &r).unwrap_err();
    assert!(
        e.to_string()
            .contains("only 0 of the host's 0 matching GPUs are free"),
        "{e}"
    );
}

#[test]
fn unknown_arch_never_matches() {
    let mut g = vec![gpu(0, Some(0), "a", Vendor::Nvidia, "fermi")];
    g[0].arch = None;
    let mut r = req(1);
    r.filters = vec![Filter {
        field: Field::Arch,
        op: Op::Ne("kepler".into()),
    }];
    assert!(allocate(&g, &Held::new(), &r).is_err());
}

#[test]
fn excluded_and_unusable_never_given() {
    let mut g = dgx();
    g[0].excluded = true;
    g[1].problem = Some("no driver".into());
    let a = allocate(&g, &Held::new(), &req(6)).unwrap();
    assert!(!idx(&g, &a).contains(&0) && !idx(&g, &a).contains(&1));
    let e = allocate(&g, &Held::new(), &req(7)).unwrap_err();
    assert!(e.to_string().contains("1 excluded"), "{e}");
    assert!(
        e.to_string()
            .contains("1 unusable (0000:11:00.0: no driver)"),
        "{e}"
    );
    let mut r = req(1);
    r.devices = vec![DeviceSel::Index(0)];
    assert!(allocate(&g, &Held::new(), &r)
        .unwrap_err()
        .to_string()
        .contains("excluded by the host config"));
    r.devices = vec![DeviceSel::Pci(g[1].pci.to_string())];
    assert!(allocate(&g, &Held::new(), &r)
        .unwrap_err()
        .to_string()
        .contains("cannot be used: no driver"));
}

#[test]
fn explicit_devices() {
    let g = dgx();
    let mut h = Held::new();
    let mut r = req(1);
    r.devices = vec![DeviceSel::Uuid("gpu-00000005".into())];
    assert_eq!(idx(&g, &allocate(&g, &h, &r).unwrap()), vec![5]);
    // count beyond the named ones: nearest to the first named device.
    r.count = 3;
    r.devices = vec![DeviceSel::Index(6)];
    assert_eq!(idx(&g, &allocate(&g, &h, &r).unwrap()), vec![4, 6, 7]);
    h.insert(Unit::Gpu(g[6].pci), "domain 'other'".into());
    let e = allocate(&g, &h, &r).unwrap_err();
    assert!(e.to_string().contains("is held by domain 'other'"), "{e}");
    r.devices = vec![DeviceSel::Pci("0000:99:00.0".into())];
    assert!(allocate(&g, &h, &r)
        .unwrap_err()
        .to_string()
        .contains("no GPU with pci 0000:99:00.0"));
    r.devices = vec![DeviceSel::Index(1), DeviceSel::Pci(g[1].pci.to_string())];
    assert!(allocate(&g, &h, &r)
        .unwrap_err()
        .to_string()
        .contains("a second time"));
    r.devices = vec![DeviceSel::Index(1)];
    r.filters = vec![Filter {
        field: Field::Arch,
        op: Op::Eq("fermi".into()),
    }];
    let e = allocate(&g, &h, &r).unwrap_err();
    assert!(
        e.to_string().contains("does not match arch == fermi"),
        "{e}"
    );
}

#[test]
fn held_reported_by_name() {
    let g = dgx();
    let mut h = Held::new();
    for (i, x) in g.iter().take(7).enumerate() {
        let who = if i < 4 { "domain 'a'" } else { "container 'b'" };
        h.insert(Unit::Gpu(x.pci), who.into());
    }
    let e = allocate(&g, &h, &req(2)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot reserve 2 GPUs: only 1 of the host's 8 matching GPUs is free: 7 held by domain 'a', container 'b'"
    );
}

/// Every refusal of a whole-GPU request word for word: these lines are what the product says.
#[test]
fn gpu_refusals_word_for_word() {
    let said = |gs: &[Gpu], h: &Held, r: &Request| allocate(gs, h, r).unwrap_err().to_string();
    let mut gs = dgx();
    gs[2].excluded = true;
    gs[3].problem = Some("no driver".into());
    gs[4] = with_migs(gs[4].clone(), &[(1, 0), (2, 0)]);
    gs[5].arch = None;
    let mut h = Held::new();
    h.insert(Unit::Gpu(gs[6].pci), "domain 'a'".into());
    let named = |devices: Vec<DeviceSel>| Request { devices, ..req(1) };
    let cases = [
        (
            vec![DeviceSel::Index(9)],
            "no GPU with index 9 on this host",
        ),
        (
            vec![DeviceSel::Index(0), DeviceSel::Uuid("gpu-00000000".into())],
            "uuid gpu-00000000 names GPU 0000:10:00.0 a second time",
        ),
        (
            vec![DeviceSel::Index(2)],
            "GPU 0000:12:00.0 (index 2) is excluded by the host config",
        ),
        (
            vec![DeviceSel::Index(3)],
            "GPU 0000:13:00.0 (index 3) cannot be used: no driver",
        ),
        (
            vec![DeviceSel::Index(4)],
            "GPU 0000:14:00.0 (index 4) is in MIG mode with 2 instances: ask for them (mig='yes')",
        ),
        (
            vec![DeviceSel::Index(6)],
            "GPU 0000:16:00.0 (index 6) is held by domain 'a'",
        ),
    ];
    for (devices, text) in cases {
        assert_eq!(said(&gs, &h, &named(devices)), text);
    }
    let mut r = named(vec![DeviceSel::Pci("0000:15:00.0".into())]);
    r.filters = vec![Filter {
        field: Field::Arch,
        op: Op::Eq("hopper".into()),
    }];
    assert_eq!(
        said(&gs, &h, &r),
        "GPU 0000:15:00.0 (pci 0000:15:00.0) does not match arch == hopper (it is nvidia unknown-arch Model hopper)"
    );
    let e = allocate(&gs, &h, &req(8)).unwrap_err();
    assert!(
        matches!(&e, AllocError::Shortage { free: 4, matching: 8, why, .. } if why.len() == 4),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "cannot reserve 8 GPUs: only 4 of the host's 8 matching GPUs are free: 1 held by domain 'a', 1 excluded, 1 in MIG mode (handed out as instances: mig='yes'), 1 unusable (0000:13:00.0: no driver)"
    );
    let one = [gpu(0, Some(0), "a", Vendor::Amd, "cdna2")];
    assert_eq!(
        said(&one, &Held::new(), &req(2)),
        "cannot reserve 2 GPUs: only 1 of the host's 1 matching GPU is free"
    );
}

/// Every refusal of a MIG request word for word: named instances, then counted ones.
#[test]
fn mig_refusals_word_for_word() {
    let said = |gs: &[Gpu], h: &Held, r: &Request| allocate(gs, h, r).unwrap_err().to_string();
    let mut m = dgx();
    m[0] = with_migs(m[0].clone(), &[(1, 0), (1, 1), (2, 0)]);
    for g in &mut m[1..4] {
        *g = with_migs(g.clone(), &[(1, 0)]);
    }
    m[1].excluded = true;
    m[2].problem = Some("Xid 79".into());
    let mut h = Held::new();
    h.insert(Unit::Gpu(m[3].pci), "domain 'w'".into());
    h.insert(unit("0000:10:00.0/gi1/ci0"), "container 'c'".into());
    let migs = |count: u32, sels: &[(u32, u32, u32)]| Request {
        mig: true,
        migs: sels
            .iter()
            .map(|&(i, gi, ci)| crate::request::MigSel {
                gpu: DeviceSel::Index(i),
                gi,
                ci,
            })
            .collect(),
        ..req(count)
    };
    let cases = [
        (migs(1, &[(9, 1, 0)]), "no GPU with index 9 on this host"),
        (
            migs(1, &[(0, 3, 0)]),
            "GPU 0000:10:00.0 has no MIG instance gi 3 ci 0 (MIG index 0 gi 3 ci 0)",
        ),
        (
            migs(2, &[(0, 2, 0), (0, 2, 0)]),
            "MIG index 0 gi 2 ci 0 is named twice",
        ),
        (
            migs(1, &[(1, 1, 0)]),
            "GPU 0000:11:00.0 (MIG index 1 gi 1 ci 0) cannot be used: excluded by the host config",
        ),
        (
            migs(1, &[(2, 1, 0)]),
            "GPU 0000:12:00.0 (MIG index 2 gi 1 ci 0) cannot be used: Xid 79",
        ),
        (
            migs(1, &[(3, 1, 0)]),
            "GPU 0000:13:00.0 (MIG index 3 gi 1 ci 0) is held whole by domain 'w'",
        ),
        (
            migs(1, &[(0, 1, 0)]),
            "0000:10:00.0/gi1/ci0 (MIG index 0 gi 1 ci 0) is held by container 'c'",
        ),
        (
            migs(3, &[]),
            "cannot reserve 3 MIG instances: only 1 of the host's 6 MIG instances on matching GPUs is free: held by container 'c'; 0000:11:00.0 unusable: excluded",
        ),
        (
            migs(2, &[(0, 2, 0)]),
            "cannot reserve 2 MIG instances, MIG index 0 gi 2 ci 0: only 1 of the host's 6 MIG instances on matching GPUs is free: held by container 'c'; 0000:11:00.0 unusable: excluded",
        ),
    ];
    for (r, text) in cases {
        assert_eq!(said(&m, &h, &r), text);
    }
    let e = allocate(&m, &h, &migs(1, &[(0, 1, 1)])).unwrap_err();
    assert!(
        matches!(e, AllocError::GiHeld { through, .. } if through == unit("0000:10:00.0/gi1/ci0")),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "0000:10:00.0/gi1/ci1 (MIG index 0 gi 1 ci 1): its GPU instance gi 1 is held by container 'c' (through 0000:10:00.0/gi1/ci0); compute instances of one GPU instance share its memory and engines"
    );
    let mut r = migs(1, &[(0, 2, 0)]);
    r.filters = vec![Filter {
        field: Field::Arch,
        op: Op::Eq("fermi".into()),
    }];
    assert_eq!(
        said(&m, &h, &r),
        "GPU 0000:10:00.0 (MIG index 0 gi 2 ci 0) does not match arch == fermi"
    );
    let lone = [with_migs(m[4].clone(), &[(1, 0)])];
    assert_eq!(
        said(&lone, &Held::new(), &migs(2, &[])),
        "cannot reserve 2 MIG instances: only 1 of the host's 1 MIG instance on matching GPUs is free"
    );
}

/// 4 GPUs: 0 and 1 shared (3 and 2 slots), 2 whole, 3 shared but in MIG mode.
fn shared_host() -> Vec<Gpu> {
    let mut v: Vec<Gpu> = (0..4)
        .map(|i| gpu(i, Some(0), "sw0", Vendor::Nvidia, "fermi"))
        .collect();
    let share = |n| Some(crate::host::config::Sharing::timeslice(n));
    v[0].sharing = share(3);
    v[1].sharing = share(2);
    v[3].sharing = share(2);
    v[3] = with_migs(v[3].clone(), &[(1, 0)]);
    v
}

fn shared(count: u32) -> Request {
    Request {
        share: true,
        ..req(count)
    }
}

#[test]
fn slots_fewest_used_first_each_on_another_gpu() {
    let g = shared_host();
    let mut h = Held::new();
    let take = |who: &str, n: u32, h: &mut Held| -> Result<Vec<Unit>, AllocError> {
        let u = allocate(&g, h, &shared(n))?;
        for x in &u {
            h.insert(*x, format!("domain '{who}'"));
        }
        Ok(u)
    };
    assert_eq!(
        take("a", 1, &mut h).unwrap(),
        vec![unit("0000:10:00.0/slot0")]
    );
    // 0 has one in use, 1 none: 1 first.
    assert_eq!(
        take("b", 1, &mut h).unwrap(),
        vec![unit("0000:11:00.0/slot0")]
    );
    // Two slots: on two GPUs, never two of one.
    assert_eq!(
        take("c", 2, &mut h).unwrap(),
        vec![unit("0000:10:00.0/slot1"), unit("0000:11:00.0/slot1")]
    );
    // 1 is full (2/2), 0 has one left; two slots cannot be on one GPU.
    assert_eq!(
        allocate(&g, &h, &shared(2)).unwrap_err().to_string(),
        "cannot reserve 2 shared GPU slots: only 1 of the host's 2 matching shared GPUs has a free slot: \
         0000:11:00.0 has 2/2 slots taken by domain 'b', domain 'c'; 2 matching GPUs are not shared by the host config"
    );
    assert_eq!(
        take("d", 1, &mut h).unwrap(),
        vec![unit("0000:10:00.0/slot2")]
    );
    assert_eq!(
        allocate(&g, &h, &shared(1)).unwrap_err().to_string(),
        "cannot reserve 1 shared GPU slot: only 0 of the host's 2 matching shared GPUs have a free slot: \
         0000:10:00.0 has 3/3 slots taken by domain 'a', domain 'c', domain 'd'; \
         0000:11:00.0 has 2/2 slots taken by domain 'b', domain 'c'; 2 matching GPUs are not shared by the host config"
    );
    // A freed slot is taken again, the lowest first.
    h.remove(&unit("0000:10:00.0/slot1"));
    assert_eq!(
        allocate(&g, &h, &shared(1)).unwrap(),
        vec![unit("0000:10:00.0/slot1")]
    );
    // Whole requests never get a shared GPU, nor a MIG GPU's instances shared.
    assert_eq!(
        allocate(&g, &Held::new(), &req(1)).unwrap(),
        vec![unit("0000:12:00.0")]
    );
    let e = allocate(&g, &Held::new(), &req(2)).unwrap_err().to_string();
    assert!(
        e.contains("2 shared (handed out as slots: share='yes')"),
        "{e}"
    );
}

#[test]
fn named_slots_and_their_refusals() {
    let g = shared_host();
    let mut h = Held::new();
    let named = |sel: &str| {
        let mut r = shared(1);
        r.devices = vec![DeviceSel::Pci(sel.into())];
        r
    };
    assert_eq!(
        allocate(&g, &h, &named("0000:11:00.0")).unwrap(),
        vec![unit("0000:11:00.0/slot0")]
    );
    h.insert(unit("0000:11:00.0/slot0"), "domain 'a'".into());
    h.insert(unit("0000:11:00.0/slot1"), "container 'b'".into());
    let said = |r: &Request, h: &Held| allocate(&g, h, r).unwrap_err().to_string();
    assert_eq!(
        said(&named("0000:11:00.0"), &h),
        "GPU 0000:11:00.0 (pci 0000:11:00.0): all 2 slots are taken, by domain 'a', container 'b'"
    );
    assert_eq!(
        said(&named("0000:12:00.0"), &h),
        "GPU 0000:12:00.0 (pci 0000:12:00.0) is not shared by the host config (\"sharing\"): ask for it whole (no share='yes')"
    );
    assert_eq!(
        said(&named("0000:13:00.0"), &h),
        "GPU 0000:13:00.0 (pci 0000:13:00.0) is in MIG mode with 1 instances: ask for them (mig='yes')"
    );
    let mut whole = req(1);
    whole.devices = vec![DeviceSel::Pci("0000:10:00.0".into())];
    assert_eq!(
        said(&whole, &h),
        "GPU 0000:10:00.0 (pci 0000:10:00.0) is shared (3 slots): ask for a slot (share='yes')"
    );
    // Held whole (say, before the config shared it): no slot of it.
    let mut w = Held::new();
    w.insert(unit("0000:10:00.0"), "domain 'old'".into());
    assert_eq!(
        said(&named("0000:10:00.0"), &w),
        "GPU 0000:10:00.0 (pci 0000:10:00.0) is held by domain 'old'"
    );
    assert!(said(&shared(2), &w).contains("0000:10:00.0 held whole by domain 'old'"));
    // The slots of one GPU are neighbours: another GPU's units are not counted.
    assert_eq!(slots_of(&h, pci("0000:10:00.0")).count(), 0);
    assert_eq!(
        sharers(&h, pci("0000:11:00.0")),
        vec!["domain 'a'".to_string(), "container 'b'".to_string()]
    );
}

/// The refusals that say what to ask for instead, in each door's words: the domain XML's
/// (the allocator's own), the annotations', the environment's, the options', a VM's.
#[test]
fn what_to_ask_for_instead_in_each_doors_words() {
    let g = shared_host();
    let h = Held::new();
    let named = |r: Request, sel: &str| Request {
        devices: vec![DeviceSel::Pci(sel.into())],
        ..r
    };
    let said = |r: &Request, w: Wording| allocate(&g, &h, r).unwrap_err().in_words(w).to_string();
    let (mig, whole, slot) = (
        named(req(1), "0000:13:00.0"),
        named(shared(1), "0000:12:00.0"),
        named(req(1), "0000:10:00.0"),
    );
    for (w, m, n, s, short) in [
        (
            Wording::Xml,
            "ask for them (mig='yes')",
            "ask for it whole (no share='yes')",
            "ask for a slot (share='yes')",
            "1 in MIG mode (handed out as instances: mig='yes'), 2 shared (handed out as slots: share='yes')",
        ),
        (
            Wording::Annotation,
            "ask for them (annotation gpuhook.io/mig: \"yes\")",
            "ask for it whole (without annotation gpuhook.io/share: \"yes\")",
            "ask for a slot (annotation gpuhook.io/share: \"yes\")",
            "1 in MIG mode (handed out as instances: annotation gpuhook.io/mig: \"yes\"), 2 shared (handed out as slots: annotation gpuhook.io/share: \"yes\")",
        ),
        (
            Wording::Env,
            "ask for them (GPUHOOK_MIG=yes)",
            "ask for it whole (without GPUHOOK_SHARE=yes)",
            "ask for a slot (GPUHOOK_SHARE=yes)",
            "1 in MIG mode (handed out as instances: GPUHOOK_MIG=yes), 2 shared (handed out as slots: GPUHOOK_SHARE=yes)",
        ),
        (
            Wording::Flag,
            "ask for them (--mig)",
            "ask for it whole (without --share)",
            "ask for a slot (--share)",
            "1 in MIG mode (handed out as instances: --mig), 2 shared (handed out as slots: --share)",
        ),
    ] {
        assert_eq!(
            said(&mig, w),
            format!("GPU 0000:13:00.0 (pci 0000:13:00.0) is in MIG mode with 1 instances: {m}")
        );
        assert_eq!(
            said(&whole, w),
            format!("GPU 0000:12:00.0 (pci 0000:12:00.0) is not shared by the host config (\"sharing\"): {n}")
        );
        assert_eq!(
            said(&slot, w),
            format!("GPU 0000:10:00.0 (pci 0000:10:00.0) is shared (3 slots): {s}")
        );
        assert_eq!(
            said(&req(2), w),
            format!("cannot reserve 2 GPUs: only 1 of the host's 4 matching GPUs is free: {short}")
        );
    }
    // Words only: any other refusal is what it was.
    let mut held = Held::new();
    held.insert(unit("0000:12:00.0"), "domain 'a'".into());
    let busy = named(req(1), "0000:12:00.0");
    let e = allocate(&g, &held, &busy).unwrap_err();
    assert!(matches!(e, AllocError::Held { .. }), "{e}");
    assert_eq!(e.clone().in_words(Wording::Flag), e);
}

/// Review F1: `replicas` lowered while slots above it are held: they count against it.
/// F3: a GPU put in MIG mode while its slots are held gives no instance.
#[test]
fn held_slots_count_whatever_their_number() {
    let mut g = shared_host();
    let mut h = Held::new();
    h.insert(unit("0000:11:00.0/slot2"), "domain 'a'".into());
    h.insert(unit("0000:11:00.0/slot3"), "domain 'b'".into());
    let mut named = shared(1);
    named.devices = vec![DeviceSel::Pci("0000:11:00.0".into())];
    assert_eq!(
        allocate(&g, &h, &named).unwrap_err().to_string(),
        "GPU 0000:11:00.0 (pci 0000:11:00.0): all 2 slots are taken, by domain 'a', domain 'b'"
    );
    // Unnamed: GPU 0 (3 slots, none used) has room, GPU 1 none.
    assert_eq!(
        allocate(&g, &h, &shared(1)).unwrap(),
        vec![unit("0000:10:00.0/slot0")]
    );
    g[0].sharing = None;
    assert!(allocate(&g, &h, &shared(1))
        .unwrap_err()
        .to_string()
        .contains("0000:11:00.0 has 2/2 slots taken by domain 'a', domain 'b'"));
    // MIG mode since: no instance while a slot is held.
    let mut g = shared_host();
    g[1] = with_migs(g[1].clone(), &[(1, 0)]);
    let mut m = req(1);
    m.mig = true;
    h.remove(&unit("0000:11:00.0/slot3"));
    // GPU 3's instance, never GPU 1's.
    assert_eq!(
        allocate(&g, &h, &m).unwrap(),
        vec![unit("0000:13:00.0/gi1/ci0")]
    );
    m.count = 2;
    let e = allocate(&g, &h, &m).unwrap_err().to_string();
    assert!(e.starts_with("cannot reserve 2 MIG instances"), "{e}");
    let mut named = m.clone();
    named.migs = vec![MigSel {
        gpu: DeviceSel::Pci("0000:11:00.0".into()),
        gi: 1,
        ci: 0,
    }];
    named.count = 1;
    assert!(allocate(&g, &h, &named)
        .unwrap_err()
        .to_string()
        .contains("is held whole by domain 'a'"));
    // A whole request's refusal names a slot holder of a GPU no longer shared.
    let mut g = shared_host();
    g[1].sharing = None;
    let e = allocate(&g, &h, &req(3)).unwrap_err().to_string();
    assert!(e.contains("1 held by domain 'a'"), "{e}");
}

/// The reasons of a shortage read as the words they replaced.
#[test]
fn shortage_reasons_word_for_word() {
    use super::error::{WhyNoGpu, WhyNoMig, WhyNoSlot};
    let p = pci("0000:10:00.0");
    for (got, want) in [
        (
            WhyNoGpu::Held {
                count: 2,
                holders: vec!["domain 'a'".into(), "container 'b'".into()],
            }
            .to_string(),
            "2 held by domain 'a', container 'b'",
        ),
        (
            WhyNoGpu::Unusable {
                count: 1,
                first: p,
                problem: String::new(),
            }
            .to_string(),
            "1 unusable (0000:10:00.0: )",
        ),
        (
            WhyNoSlot::HeldWhole {
                pci: p,
                holder: "domain 'a'".into(),
            }
            .to_string(),
            "0000:10:00.0 held whole by domain 'a'",
        ),
        (WhyNoSlot::Excluded(p).to_string(), "0000:10:00.0 excluded"),
        (
            WhyNoSlot::Unusable {
                pci: p,
                problem: "no driver".into(),
            }
            .to_string(),
            "0000:10:00.0 unusable (no driver)",
        ),
        (
            WhyNoSlot::OursAlready(p).to_string(),
            "0000:10:00.0 has a slot of this holder's already",
        ),
        (
            WhyNoSlot::NotShared { count: 1 }.to_string(),
            "1 matching GPU is not shared by the host config",
        ),
        (
            WhyNoMig::Unusable {
                pci: p,
                problem: "excluded".into(),
            }
            .to_string(),
            "0000:10:00.0 unusable: excluded",
        ),
    ] {
        assert_eq!(got, want);
    }
}

/// An architecture no GPU can have is refused as unknown, naming the known ones: by name
/// (any case, `<or>` lists too), by Placement's class; a filter that only compares or
/// excludes is not a name; a name the config's overrides give is known.
#[test]
fn an_unknown_architecture_is_named() {
    use crate::request::extra_specs::Op;
    use crate::request::{Field, Filter};
    let cfg = crate::host::config::Config::default();
    let gpus = dgx();
    let known = super::known_archs(&cfg, &gpus);
    assert!(known.contains("hopper") && known.contains("fermi") && known.contains("cdna3"));
    let with = |op: Op| {
        let mut r = req(1);
        r.filters.push(Filter {
            field: Field::Arch,
            op,
        });
        r
    };
    let e = super::known_arch(&with(Op::Eq("fermy".into())), &known).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("unknown architecture 'fermy' (known: ada, ampere, blackwell, "),
        "{e}"
    );
    assert!(e
        .to_string()
        .ends_with("; others can be named in the config's \"overrides\")"));
    super::known_arch(&with(Op::Eq("hopper".into())), &known).unwrap();
    let e = super::known_arch(
        &with(Op::OneOf(vec!["hopper".into(), "hoper".into()])),
        &known,
    )
    .unwrap_err();
    assert!(
        e.to_string().starts_with("unknown architecture 'hoper'"),
        "{e}"
    );
    for fine in [
        Op::Ne("fermy".into()),
        Op::Contains("herm".into()),
        Op::Lt("z".into()),
    ] {
        super::known_arch(&with(fine), &known).unwrap();
    }
    super::known_arch(&with(Op::Class("CUSTOM_GPU_HOPPER".into())), &known).unwrap();
    let e = super::known_arch(&with(Op::Class("CUSTOM_GPU_HOPER".into())), &known).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("resource class CUSTOM_GPU_HOPER names no known architecture (known: "),
        "{e}"
    );
    // The config's overrides name one of their own.
    let mut known = known;
    known.insert("tesla-x".into());
    super::known_arch(&with(Op::Eq("tesla-x".into())), &known).unwrap();
}
