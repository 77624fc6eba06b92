//! GPU architecture (and a default model name) from PCI ids.
//!
//! NVIDIA publishes no device-id → architecture table; the chip name in the PCI id database
//! (`GF100GL`, `GK110BGL`, `GH100`, …) gives it by prefix. The built-in table covers the
//! data-centre parts an operator is likely to hand to containers (starting with the Fermi
//! Teslas of the original blueprint), so no file is read for them; anything else falls back
//! to the host's `pci.ids` (Debian `pci.ids`/`hwdata`), read only when needed.

use std::path::{Path, PathBuf};

/// (vendor, device, architecture, model)
type ArchRow = (u16, u16, &'static str, &'static str);

#[rustfmt::skip]
const TABLE: &[ArchRow] = &[
    // NVIDIA Fermi (the blueprint's cg1 hosts)
    (0x10de, 0x06d1, "fermi", "Tesla C2050 / C2070"),
    (0x10de, 0x06d2, "fermi", "Tesla M2070"),
    (0x10de, 0x06de, "fermi", "Tesla M2050"),
    (0x10de, 0x06df, "fermi", "Tesla M2070-Q"),
    (0x10de, 0x06d8, "fermi", "Quadro 6000"),
    (0x10de, 0x06d9, "fermi", "Quadro 5000"),
    (0x10de, 0x108e, "fermi", "Tesla C2090"),
    (0x10de, 0x1091, "fermi", "Tesla M2090"),
    (0x10de, 0x1094, "fermi", "Tesla M2075"),
    (0x10de, 0x1096, "fermi", "Tesla C2050 / C2075"),
    // Kepler
    (0x10de, 0x1021, "kepler", "Tesla K20Xm"),
    (0x10de, 0x1022, "kepler", "Tesla K20c"),
    (0x10de, 0x1023, "kepler", "Tesla K40m"),
    (0x10de, 0x1024, "kepler", "Tesla K40c"),
    (0x10de, 0x1028, "kepler", "Tesla K20m"),
    (0x10de, 0x102d, "kepler", "Tesla K80"),
    (0x10de, 0x118f, "kepler", "Tesla K10"),
    // Maxwell
    (0x10de, 0x13bd, "maxwell", "Tesla M10"),
    (0x10de, 0x13f2, "maxwell", "Tesla M60"),
    (0x10de, 0x17fd, "maxwell", "Tesla M40"),
    // Pascal
    (0x10de, 0x15f7, "pascal", "Tesla P100 PCIe 12GB"),
    (0x10de, 0x15f8, "pascal", "Tesla P100 PCIe 16GB"),
    (0x10de, 0x15f9, "pascal", "Tesla P100 SXM2 16GB"),
    (0x10de, 0x1b38, "pascal", "Tesla P40"),
    (0x10de, 0x1bb3, "pascal", "Tesla P4"),
    // Volta
    (0x10de, 0x1db1, "volta", "Tesla V100 SXM2 16GB"),
    (0x10de, 0x1db4, "volta", "Tesla V100 PCIe 16GB"),
    (0x10de, 0x1db5, "volta", "Tesla V100 SXM2 32GB"),
    (0x10de, 0x1db6, "volta", "Tesla V100 PCIe 32GB"),
    (0x10de, 0x1df6, "volta", "Tesla V100S PCIe 32GB"),
    // Turing
    (0x10de, 0x1eb8, "turing", "Tesla T4"),
    // Ampere
    (0x10de, 0x20b0, "ampere", "A100 SXM4 40GB"),
    (0x10de, 0x20b1, "ampere", "A100 PCIe 40GB"),
    (0x10de, 0x20b2, "ampere", "A100 SXM4 80GB"),
    (0x10de, 0x20b5, "ampere", "A100 PCIe 80GB"),
    (0x10de, 0x20b7, "ampere", "A30"),
    (0x10de, 0x20f1, "ampere", "A100 PCIe 40GB"),
    (0x10de, 0x2235, "ampere", "A40"),
    (0x10de, 0x2236, "ampere", "A10"),
    (0x10de, 0x2237, "ampere", "A10G"),
    (0x10de, 0x25b6, "ampere", "A2 / A16"),
    // Ada Lovelace
    (0x10de, 0x26b1, "ada", "RTX 6000 Ada Generation"),
    (0x10de, 0x26b5, "ada", "L40"),
    (0x10de, 0x26b9, "ada", "L40S"),
    (0x10de, 0x27b8, "ada", "L4"),
    // Hopper
    (0x10de, 0x2321, "hopper", "H100 NVL"),
    (0x10de, 0x2324, "hopper", "H800"),
    (0x10de, 0x2330, "hopper", "H100 SXM5 80GB"),
    (0x10de, 0x2331, "hopper", "H100 PCIe"),
    (0x10de, 0x2335, "hopper", "H200"),
    (0x10de, 0x2342, "hopper", "GH200"),
    // Blackwell
    (0x10de, 0x2901, "blackwell", "B200"),
    (0x10de, 0x2941, "blackwell", "GB200"),
    // AMD Instinct
    (0x1002, 0x66a1, "gcn5", "Instinct MI50"),
    (0x1002, 0x738c, "cdna", "Instinct MI100"),
    (0x1002, 0x7408, "cdna2", "Instinct MI250X"),
    (0x1002, 0x740c, "cdna2", "Instinct MI250X/MI250"),
    (0x1002, 0x740f, "cdna2", "Instinct MI210"),
    (0x1002, 0x74a0, "cdna3", "Instinct MI300A"),
    (0x1002, 0x74a1, "cdna3", "Instinct MI300X"),
    // Intel data-centre GPUs
    (0x8086, 0x0bd5, "xe-hpc", "Data Center GPU Max 1550"),
    (0x8086, 0x0bd6, "xe-hpc", "Data Center GPU Max 1550"),
    (0x8086, 0x0bda, "xe-hpc", "Data Center GPU Max 1100"),
    (0x8086, 0x56c0, "xe-hpg", "Data Center GPU Flex 170"),
    (0x8086, 0x56c1, "xe-hpg", "Data Center GPU Flex 140"),
];

/// Architecture and model of a known PCI id.
pub fn builtin(vendor: u16, device: u16) -> Option<(&'static str, &'static str)> {
    TABLE
        .iter()
        .find(|e| e.0 == vendor && e.1 == device)
        .map(|e| (e.2, e.3))
}

/// Every architecture name gpuhook knows (the built-in table and the chip prefixes).
pub fn known_names() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = TABLE
        .iter()
        .map(|e| e.2)
        .chain(CHIP_PREFIXES.iter().map(|p| p.1))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

const CHIP_PREFIXES: [(&str, &str); 12] = [
    ("GB", "blackwell"),
    ("GH", "hopper"),
    ("AD", "ada"),
    ("GA", "ampere"),
    ("TU", "turing"),
    ("GV", "volta"),
    ("GP", "pascal"),
    ("GM", "maxwell"),
    ("GK", "kepler"),
    ("GF", "fermi"),
    ("GT", "tesla"),
    ("G8", "tesla"),
];

/// NVIDIA architecture from a chip name's prefix (`GF100GL` → fermi).
pub fn nvidia_arch_from_chip(chip: &str) -> Option<&'static str> {
    let chip = chip.trim_start();
    CHIP_PREFIXES
        .iter()
        .find(|(p, _)| {
            chip.starts_with(p) && chip[p.len()..].starts_with(|c: char| c.is_ascii_digit())
        })
        .map(|(_, a)| *a)
        .or_else(|| {
            (chip.starts_with("G9") && chip[2..].starts_with(|c: char| c.is_ascii_digit()))
                .then_some("tesla")
        })
}

/// Where Debian/RHEL keep the PCI id database.
pub const PCI_IDS_PATHS: [&str; 3] = [
    "/usr/share/misc/pci.ids",
    "/usr/share/hwdata/pci.ids",
    "/usr/share/pci.ids",
];

/// The device line of `vendor:device` in a `pci.ids` text, e.g. `GF100GL [Tesla T20 Processor]`.
pub fn pci_ids_name(text: &[u8], vendor: u16, device: u16) -> Option<String> {
    let vkey = format!("\n{vendor:04x}  ");
    let start = find(text, vkey.as_bytes())? + 1;
    let section = &text[start..];
    // The vendor section ends at the next line that starts with a non-tab character.
    let mut end = section.len();
    let mut pos = 0;
    while let Some(nl) = section[pos..].iter().position(|b| *b == b'\n') {
        let line_start = pos + nl + 1;
        match section.get(line_start) {
            Some(b'\t') | Some(b'#') => {}
            Some(_) => {
                end = line_start;
                break;
            }
            None => break,
        }
        pos = line_start;
    }
    let section = &section[..end];
    let dkey = format!("\n\t{device:04x}  ");
    let at = find(section, dkey.as_bytes())? + dkey.len();
    let line = &section[at..];
    let line = &line[..line.iter().position(|b| *b == b'\n').unwrap_or(line.len())];
    Some(String::from_utf8_lossy(line).trim().to_owned())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Lazily loaded PCI id database.
#[derive(Default)]
pub struct PciIds {
    configured: Option<PathBuf>,
    loaded: Option<Option<Vec<u8>>>,
}

impl PciIds {
    pub fn new(configured: Option<&Path>) -> Self {
        PciIds {
            configured: configured.map(Path::to_path_buf),
            loaded: None,
        }
    }

    fn text(&mut self) -> Option<&[u8]> {
        if self.loaded.is_none() {
            let read = match &self.configured {
                Some(p) => std::fs::read(p).ok(),
                None => PCI_IDS_PATHS.iter().find_map(|p| std::fs::read(p).ok()),
            };
            self.loaded = Some(read);
        }
        self.loaded.as_ref().and_then(|o| o.as_deref())
    }

    /// (architecture, model) from the database: the model is the bracketed marketing name
    /// when there is one, else the chip name.
    pub fn lookup(&mut self, vendor: u16, device: u16) -> Option<(Option<&'static str>, String)> {
        let name = pci_ids_name(self.text()?, vendor, device)?;
        let (chip, model) = match (name.find('['), name.rfind(']')) {
            (Some(a), Some(b)) if b > a => (
                name[..a].trim().to_owned(),
                name[a + 1..b].trim().to_owned(),
            ),
            _ => (name.clone(), name.clone()),
        };
        let arch = if vendor == 0x10de {
            nvidia_arch_from_chip(&chip)
        } else {
            None
        };
        Some((arch, model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_blueprint_teslas() {
        assert_eq!(builtin(0x10de, 0x06de), Some(("fermi", "Tesla M2050")));
        assert_eq!(builtin(0x10de, 0x1091), Some(("fermi", "Tesla M2090")));
        assert_eq!(builtin(0x10de, 0x2330).unwrap().0, "hopper");
        assert_eq!(builtin(0x10de, 0xffff), None);
    }

    #[test]
    fn chip_prefixes() {
        for (chip, arch) in [
            ("GF100GL", "fermi"),
            ("GF110GL", "fermi"),
            ("GK110BGL", "kepler"),
            ("GM204GL", "maxwell"),
            ("GP100GL", "pascal"),
            ("GV100GL", "volta"),
            ("TU104GL", "turing"),
            ("GA100", "ampere"),
            ("AD102GL", "ada"),
            ("GH100", "hopper"),
            ("GB202", "blackwell"),
            ("GT200GL", "tesla"),
            ("G92", "tesla"),
        ] {
            assert_eq!(nvidia_arch_from_chip(chip), Some(arch), "{chip}");
        }
        assert_eq!(nvidia_arch_from_chip("NF200"), None);
        assert_eq!(nvidia_arch_from_chip("GTX"), None);
    }

    const IDS: &str = "# comment\n0fff  Other\n\t06de  Not this one\n10de  NVIDIA Corporation\n\t06de  GF100GL [Tesla T20 Processor]\n\t\t10de 0773  Tesla S2050\n\t1af1  GA100 [A100 NVSwitch]\n\t2330  GH100[H100 SXM5 80GB]\n\t2b85  GB202 [GeForce RTX 5090]\n10df  Emulex\n\t0720  OneConnect\n";

    #[test]
    fn pci_ids_lookup() {
        let t = IDS.as_bytes();
        assert_eq!(
            pci_ids_name(t, 0x10de, 0x06de).as_deref(),
            Some("GF100GL [Tesla T20 Processor]")
        );
        assert_eq!(
            pci_ids_name(t, 0x10de, 0x0720),
            None,
            "must not leak into the next vendor"
        );
        assert_eq!(pci_ids_name(t, 0x1002, 0x06de), None);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pci.ids");
        std::fs::write(&p, IDS).unwrap();
        let mut db = PciIds::new(Some(&p));
        assert_eq!(
            db.lookup(0x10de, 0x2b85),
            Some((Some("blackwell"), "GeForce RTX 5090".into()))
        );
        assert_eq!(
            db.lookup(0x10de, 0x2330),
            Some((Some("hopper"), "H100 SXM5 80GB".into()))
        );
        assert_eq!(db.lookup(0x10de, 0x1234), None);
        let mut none = PciIds::new(Some(&dir.path().join("missing")));
        assert_eq!(none.lookup(0x10de, 0x06de), None);
    }

    /// Where the host has a PCI id database, the built-in NVIDIA entries agree with it.
    #[test]
    fn table_agrees_with_host_pci_ids() {
        let mut db = PciIds::default();
        assert!(
            db.text().is_some(),
            "no pci.ids on this host: install hwdata (Debian) or pciutils' database"
        );
        for (v, d, arch, _) in TABLE.iter().filter(|e| e.0 == 0x10de) {
            if let Some((Some(a), _)) = db.lookup(*v, *d) {
                assert_eq!(a, *arch, "{v:04x}:{d:04x}");
            }
        }
    }
}
