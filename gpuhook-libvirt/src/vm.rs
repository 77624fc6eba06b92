//! `gpuhook-libvirt request VM --count N [--arch A] [--vendor V] [--model M] [--device SEL]…
//! [--numa N]` of a QEMU domain (a virtual machine): libvirt's QEMU hook cannot change a
//! domain's XML, so the GPUs are chosen here, now, by the rules a container's are chosen by
//! (a GPU parked on `vfio-pci` is free for a VM), and written, each with the other functions
//! of its PCI device, as `<hostdev mode='subsystem' type='pci' managed='yes'>` elements into
//! the persistent definition. Each carries a user alias `ua-gpuhook-DDDD-BB-SS-F` (libvirt
//! keeps user aliases): `--clear`, or the next `request`, removes exactly those. Nothing is
//! reserved here: the VM's `prepare` reserves them, or refuses its start naming who took one
//! meanwhile.

use gpuhook::doors::cli::RequestArgs;
use gpuhook::host::config::Config;
use gpuhook::ids::Pci;
use gpuhook::request::hostdev::{self, Hostdev};
use gpuhook::request::oci::Pairs;
use gpuhook::reserve::state::Store;
use gpuhook::reserve::vm::{self, ChosenGpu, ForVm};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::sys;

/// The user alias gpuhook gives the hostdevs it writes.
const ALIAS: &str = "ua-gpuhook-";

/// Whether the domain is the QEMU driver's (a virtual machine).
pub fn is_qemu(dom: &Domain) -> Result<bool, String> {
    let conn = dom.connect().map_err(|e| e.to_string())?;
    let t = conn.driver_type().map_err(|e| e.to_string())?;
    Ok(t.eq_ignore_ascii_case("QEMU"))
}

/// The request of `a` (a VM's: count, filters, named devices), in the grammar every door
/// shares; what only a container's request has is refused.
fn vm_request(name: &str, a: &RequestArgs) -> Result<gpuhook::request::Request, String> {
    let only_containers = [
        ("--capabilities", a.capabilities.is_some()),
        ("--mode", a.mode.is_some()),
        ("--uid", a.uid.is_some()),
        ("--gid", a.gid.is_some()),
        ("--mig", a.mig),
        ("--share", a.share),
        ("--driver", a.driver.is_some()),
    ];
    if let Some((opt, _)) = only_containers.iter().find(|(_, given)| *given) {
        return Err(format!(
            "vm '{name}': {opt} is for a container's request; a VM is given whole GPUs as hostdevs"
        ));
    }
    let mut p = Pairs::new();
    let mut put = |key: &str, opt: &str, v: Option<String>| {
        if let Some(v) = v {
            p.insert(key.into(), (opt.into(), v));
        }
    };
    put("gpus", "--count", a.count.map(|c| c.to_string()));
    put("arch", "--arch", a.arch.clone());
    put("vendor", "--vendor", a.vendor.clone());
    put("model", "--model", a.model.clone());
    put(
        "devices",
        "--device",
        (!a.device.is_empty()).then(|| a.device.join(",")),
    );
    gpuhook::request::oci::request(&p).map_err(|e| format!("vm '{name}': {e}"))
}

/// `request` (with `a`) or `request --clear` (without) of a QEMU domain.
pub fn request(
    conn: &Connect,
    dom: &Domain,
    name: &str,
    a: Option<&RequestArgs>,
    live: bool,
) -> Result<(), String> {
    if live {
        return Err(format!("vm '{name}': --live changes a running LXC domain's request; a running VM is given a GPU with 'virsh attach-device'"));
    }
    if !dom.is_persistent().map_err(|e| e.to_string())? {
        return Err(format!(
            "vm '{name}' is transient: it has no definition to pass GPUs through in"
        ));
    }
    let xml = dom
        .xml_desc(sys::VIR_DOMAIN_XML_INACTIVE)
        .map_err(|e| format!("vm '{name}': {e}"))?;
    let (kept, dropped) = without_ours(&xml);
    let Some(a) = a else {
        define(conn, name, &kept)?;
        println!(
            "vm '{name}' passes through none of gpuhook's GPUs now ({} hostdevs removed; from its next start)",
            dropped
        );
        return Ok(());
    };
    let req = vm_request(name, a)?;
    let cfg = Config::load().map_err(|e| e.to_string())?;
    let parsed = hostdev::parse_domain(kept.as_bytes()).map_err(|e| format!("vm '{name}': {e}"))?;
    // GPUs its definition passes through by hand already: not chosen again.
    let own = vm::ask(&cfg, &parsed).map_err(|e| format!("vm '{name}': {e}"))?;
    let taken: Vec<Pci> = own.units.iter().map(|u| u.pci()).collect();
    let inv = gpuhook::host::inventory::scan(&cfg).map_err(|e| e.to_string())?;
    let st = Store::new(&cfg.state_file)
        .read()
        .map_err(|e| e.to_string())?;
    let passed = vm::passed_through(&cfg, gpuhook::host::procfs::REAL);
    let chosen = vm::choose(
        &cfg,
        &inv,
        &st,
        &passed,
        ForVm {
            uuid: &parsed.uuid,
            numa: a.numa,
            taken: &taken,
        },
        &req,
    )
    .map_err(|e| format!("vm '{name}': {e}"))?;
    let new = with_hostdevs(&kept, &chosen)
        .ok_or_else(|| format!("vm '{name}': its definition has no <devices> to add to"))?;
    // What the hook will read: exactly these GPUs more.
    let check = hostdev::parse_domain(new.as_bytes())
        .map(|d| d.hostdevs)
        .map_err(|e| format!("vm '{name}': the new definition does not parse back: {e}"))?;
    let added: Vec<Pci> = check
        .iter()
        .filter_map(|h| match h {
            Hostdev::Pci { addr, .. } => addr.pci(),
            Hostdev::Mdev { .. } => None,
        })
        .filter(|p| chosen.iter().any(|c| c.functions.contains(p)))
        .collect();
    if added.len() != chosen.iter().map(|c| c.functions.len()).sum::<usize>() {
        return Err(format!(
            "vm '{name}': the new definition does not pass the chosen GPUs through"
        ));
    }
    define(conn, name, &new)?;
    let said: Vec<String> = chosen.iter().map(describe).collect();
    let active = dom.is_active().unwrap_or(false);
    println!(
        "vm '{name}' now passes through {}{}",
        said.join(", "),
        if active {
            " (from its next start; reserved then)"
        } else {
            " (reserved when it starts)"
        }
    );
    Ok(())
}

/// `GPU 0000:3b:00.0 (with 0000:3b:00.1)`.
fn describe(c: &ChosenGpu) -> String {
    let rest: Vec<&str> = c.functions[1..].iter().map(|f| f.as_str()).collect();
    if rest.is_empty() {
        format!("GPU {}", c.gpu)
    } else {
        format!("GPU {} (with {})", c.gpu, rest.join(", "))
    }
}

fn define(conn: &Connect, name: &str, xml: &str) -> Result<(), String> {
    conn.define_domain_xml(xml)
        .map(drop)
        .map_err(|e| format!("vm '{name}': defining it anew: {e}"))
}

/// The domain XML without the hostdevs gpuhook wrote (those with its user alias), and how many
/// there were. libvirt formats the XML itself: each `<hostdev` opens an element that the next
/// `</hostdev>` closes.
fn without_ours(xml: &str) -> (String, usize) {
    let ours =
        |b: &str| b.contains(&format!("name='{ALIAS}")) || b.contains(&format!("name=\"{ALIAS}"));
    let mut out = String::with_capacity(xml.len());
    let mut rest = xml;
    let mut n = 0;
    while let Some(at) = rest.find("<hostdev") {
        let Some(e) = rest[at..].find("</hostdev>") else {
            break;
        };
        let end = at + e + "</hostdev>".len();
        if !ours(&rest[at..end]) {
            out.push_str(&rest[..end]);
            rest = &rest[end..];
            continue;
        }
        // The element, and its line when it stands alone on it.
        let before = &rest[..at];
        let line = before.rfind('\n').map_or(0, |i| i + 1);
        let alone = before[line..].trim().is_empty();
        out.push_str(&rest[..if alone { line } else { at }]);
        rest = &rest[end..];
        if alone {
            rest = rest.strip_prefix('\n').unwrap_or(rest);
        }
        n += 1;
    }
    out.push_str(rest);
    (out, n)
}

/// The domain XML with a hostdev for each function of each chosen GPU, at the end of
/// `<devices>`; `None` when it has no `<devices>`.
fn with_hostdevs(xml: &str, chosen: &[ChosenGpu]) -> Option<String> {
    let at = xml.rfind("</devices>")?;
    let mut add = String::new();
    for c in chosen {
        for f in &c.functions {
            let s = f.as_str();
            add.push_str(&format!(
                "    <hostdev mode='subsystem' type='pci' managed='yes'>\n      <source>\n        <address domain='0x{}' bus='0x{}' slot='0x{}' function='0x{}'/>\n      </source>\n      <alias name='{ALIAS}{}'/>\n    </hostdev>\n",
                &s[0..4],
                &s[5..7],
                &s[8..10],
                &s[11..12],
                s.replace([':', '.'], "-")
            ));
        }
    }
    let line = xml[..at].rfind('\n').map_or(at, |n| n + 1);
    Some(format!("{}{add}{}", &xml[..line], &xml[line..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = "<domain type='kvm'>\n  <name>vm1</name>\n  <uuid>9f0c9a5e-2f4b-4c51-8e7a-1d2c3b4a5f60</uuid>\n  <devices>\n    <emulator>/usr/bin/qemu-system-x86_64</emulator>\n    <hostdev mode='subsystem' type='pci' managed='yes'>\n      <source>\n        <address domain='0x0000' bus='0x5e' slot='0x00' function='0x0'/>\n      </source>\n    </hostdev>\n  </devices>\n</domain>\n";

    fn chosen() -> Vec<ChosenGpu> {
        vec![ChosenGpu {
            gpu: "0000:3b:00.0".parse().unwrap(),
            functions: vec![
                "0000:3b:00.0".parse().unwrap(),
                "0000:3b:00.1".parse().unwrap(),
            ],
        }]
    }

    /// gpuhook's hostdevs go in with its alias, read back as the hook reads them, and come
    /// out again leaving the definition as it was (the operator's own hostdev kept).
    #[test]
    fn hostdevs_in_and_out() {
        let new = with_hostdevs(XML, &chosen()).unwrap();
        let d = hostdev::parse_domain(new.as_bytes()).unwrap();
        let pcis: Vec<String> = d
            .hostdevs
            .iter()
            .filter_map(|h| match h {
                Hostdev::Pci { addr, managed } => {
                    assert!(*managed);
                    Some(addr.to_string())
                }
                Hostdev::Mdev { .. } => None,
            })
            .collect();
        assert_eq!(pcis, ["0000:5e:00.0", "0000:3b:00.0", "0000:3b:00.1"]);
        assert!(
            new.contains("<alias name='ua-gpuhook-0000-3b-00-1'/>"),
            "{new}"
        );
        let (back, n) = without_ours(&new);
        assert_eq!(n, 2);
        assert_eq!(back, XML);
        assert_eq!(without_ours(XML), (XML.to_string(), 0));
        assert_eq!(
            describe(&chosen()[0]),
            "GPU 0000:3b:00.0 (with 0000:3b:00.1)"
        );
        assert!(with_hostdevs("<domain/>", &chosen()).is_none());
    }

    #[test]
    fn only_a_vms_options() {
        let a = RequestArgs {
            count: Some(2),
            arch: Some("hopper".into()),
            ..Default::default()
        };
        let r = vm_request("vm1", &a).unwrap();
        assert_eq!(r.to_string(), "2 GPUs, arch == hopper");
        let mig = RequestArgs {
            count: Some(1),
            mig: true,
            ..Default::default()
        };
        assert_eq!(
            vm_request("vm1", &mig).unwrap_err(),
            "vm 'vm1': --mig is for a container's request; a VM is given whole GPUs as hostdevs"
        );
    }
}
