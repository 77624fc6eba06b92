//! The program's whole way from `/`, on real directories (as root: ownership is the point).

use super::*;
use std::os::unix::fs::{chown, lchown, symlink, MetadataExt, PermissionsExt};

fn mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// A tree `T/opt-nvidia/bin/nvidia-smi` (all root's, 0755), where T is a fresh directory.
fn tree() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    mode(t.path(), 0o755);
    let bin = t.path().join("opt-nvidia/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let smi = bin.join("nvidia-smi");
    std::fs::write(&smi, "#!/bin/sh\necho checked\n").unwrap();
    mode(&smi, 0o755);
    (t, smi)
}

fn ino(p: &Path) -> (u64, u64) {
    let m = std::fs::metadata(p).unwrap();
    (m.dev(), m.ino())
}

fn same(fd: &OwnedFd, p: &Path) -> bool {
    let st = fstat(fd).unwrap();
    (st.st_dev, st.st_ino) == ino(p)
}

/// The reviewer's case: an account-owned `opt-nvidia` above a root-owned `bin/nvidia-smi`.
/// The account could swap `bin` between the check and the exec: refused, naming it. The
/// same tree all root's: trusted, and its descriptor is the file's.
#[test]
fn an_account_owned_directory_anywhere_on_the_way_refuses_the_program() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("needs root (chown): skipped");
        return;
    }
    let (t, smi) = tree();
    let opt = t.path().join("opt-nvidia");
    let ok = trusted_program(&smi).unwrap();
    assert_eq!(ok.path, smi);
    assert!(same(&ok.fd, &smi));
    chown(&opt, Some(65534), None).unwrap();
    assert_eq!(
        trusted_program(&smi).unwrap_err(),
        ProgramError::DirNotRoots {
            path: smi.clone(),
            dir: opt.clone(),
            uid: 65534
        }
    );
    assert_eq!(
        trusted_program(&smi).unwrap_err().to_string(),
        format!(
            "{}: a directory on the way to it ({}) is owned by uid 65534, not root: not run",
            smi.display(),
            opt.display()
        )
    );
    chown(&opt, Some(0), None).unwrap();
    // Group-writable anywhere on the way: refused; sticky above its own directory: not.
    mode(&opt, 0o775);
    assert!(matches!(
        trusted_program(&smi),
        Err(ProgramError::DirWritable { mode: 0o775, .. })
    ));
    mode(&opt, 0o1777);
    trusted_program(&smi).unwrap();
    mode(&opt, 0o755);
    mode(smi.parent().unwrap(), 0o1777);
    assert!(matches!(
        trusted_program(&smi),
        Err(ProgramError::DirWritable { mode: 0o1777, .. })
    ));
    mode(smi.parent().unwrap(), 0o755);
    // The program itself: root's, not writable by group or others, a regular file.
    mode(&smi, 0o775);
    assert_eq!(
        trusted_program(&smi).unwrap_err().to_string(),
        format!(
            "{} may be written by group or others (mode 775): not run",
            smi.display()
        )
    );
    mode(&smi, 0o755);
    chown(&smi, Some(65534), None).unwrap();
    assert_eq!(
        trusted_program(&smi).unwrap_err().to_string(),
        format!("{} is owned by uid 65534, not root: not run", smi.display())
    );
    chown(&smi, Some(0), None).unwrap();
    assert!(matches!(
        trusted_program(smi.parent().unwrap()),
        Err(ProgramError::NotAFile { .. })
    ));
    assert!(matches!(
        trusted_program(&smi.join("x")),
        Err(ProgramError::NotDir { .. })
    ));
    let gone = t.path().join("nope/nvidia-smi");
    assert_eq!(
        trusted_program(&gone).unwrap_err().to_string(),
        format!(
            "no {}: No such file or directory (os error 2)",
            gone.display()
        )
    );
    assert!(matches!(
        trusted_program(Path::new("bin/nvidia-smi")),
        Err(ProgramError::NotAbsolute { .. })
    ));
}

/// Links on the way (Debian's alternatives: `bin/nvidia-smi` → `/…/alternatives/smi` →
/// `../lib/nvidia-smi`) are followed, each read from a checked directory, and the target's
/// whole way is checked too: a target below an account's directory is refused, a link that
/// is not root's is, and so is a loop.
#[test]
fn links_on_the_way_are_followed_and_their_targets_checked() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("needs root (chown): skipped");
        return;
    }
    let (t, real) = tree();
    let bin = t.path().join("bin");
    let alt = t.path().join("etc/alternatives");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&alt).unwrap();
    symlink(alt.join("smi"), bin.join("nvidia-smi")).unwrap();
    symlink("../../opt-nvidia/bin/nvidia-smi", alt.join("smi")).unwrap();
    let ok = trusted_program(&bin.join("nvidia-smi")).unwrap();
    assert_eq!(ok.path, real);
    assert!(same(&ok.fd, &real));
    // The target below an account's directory.
    chown(t.path().join("opt-nvidia"), Some(65534), None).unwrap();
    assert!(matches!(
        trusted_program(&bin.join("nvidia-smi")),
        Err(ProgramError::DirNotRoots { uid: 65534, .. })
    ));
    chown(t.path().join("opt-nvidia"), Some(0), None).unwrap();
    // A link of another owner's.
    lchown(alt.join("smi"), Some(65534), None).unwrap();
    assert!(matches!(
        trusted_program(&bin.join("nvidia-smi")),
        Err(ProgramError::NotRoots { uid: 65534, .. })
    ));
    // A loop.
    symlink("b", bin.join("a")).unwrap();
    symlink("a", bin.join("b")).unwrap();
    assert!(matches!(
        trusted_program(&bin.join("a")),
        Err(ProgramError::Links { .. })
    ));
}
