//! The .deb packages `scripts/build-deb.sh` builds (into target/debian/): what
//! they install, that the unit passes systemd's own checks, that the arm64
//! binary is the small aarch64 one, and that an edited site config survives an
//! upgrade (a real dpkg install into a scratch root).

use std::path::{Path, PathBuf};
use std::process::Command;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const MIB: u64 = 1024 * 1024;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn deb(arch: &str) -> PathBuf {
    let p = root().join(format!("target/debian/tidemark_{VERSION}-1_{arch}.deb"));
    assert!(
        p.exists(),
        "{} is missing: build the packages with scripts/build-deb.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Unpacks `deb` (files and control area) into a new temp dir.
fn unpack(deb: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dir.path()));
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(deb)
        .arg(dir.path().join("DEBIAN")));
    dir
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// ELF e_machine of a binary.
fn elf_machine(p: &Path) -> u16 {
    let b = std::fs::read(p).unwrap();
    assert_eq!(&b[..4], b"\x7fELF", "{} is not ELF", p.display());
    u16::from_le_bytes([b[18], b[19]])
}

/// The code a gateway runs comes first in the text (contrib/link/hot-text.ld): its
/// patterns hold on both targets and both linkers (lld, GNU ld).
fn hot_text_first(arch: &str, bin: &Path) {
    let sections = run(Command::new("readelf").arg("-SW").arg(bin));
    let section = |name: &str| {
        sections.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let i = f.iter().position(|w| *w == name)?;
            let hex = |k: usize| u64::from_str_radix(f.get(i + k)?, 16).ok();
            Some((hex(2)?, hex(4)?))
        })
    };
    let (Some((hot_at, hot)), Some((text_at, text))) = (section(".text.hot"), section(".text"))
    else {
        panic!("{arch}: no .text.hot before .text:\n{sections}");
    };
    assert!(
        hot_at < text_at && hot > MIB && text > MIB,
        "{arch}: .text.hot {hot} bytes at {hot_at:#x}, .text {text} at {text_at:#x}"
    );
}

fn unit_path(tree: &Path) -> PathBuf {
    [
        "usr/lib/systemd/system/tidemark.service",
        "lib/systemd/system/tidemark.service",
    ]
    .iter()
    .map(|p| tree.join(p))
    .find(|p| p.exists())
    .expect("the package installs tidemark.service")
}

#[test]
fn both_packages_install_binary_unit_configs_user_and_docs() {
    for (arch, machine) in [("amd64", 62u16), ("arm64", 183u16)] {
        let deb = deb(arch);
        let tree = unpack(&deb);
        let t = tree.path();
        let control = read(&t.join("DEBIAN/control"));
        for want in [
            "Package: tidemark\n".to_owned(),
            format!("Version: {VERSION}-1\n"),
            format!("Architecture: {arch}\n"),
        ] {
            assert!(control.contains(&want), "{arch}: no {want:?} in\n{control}");
        }
        assert!(control.contains("libc6"), "{arch}: {control}");
        assert!(control.contains("systemd"), "{arch}: {control}");

        let bin = t.join("usr/bin/tidemark");
        assert_eq!(elf_machine(&bin), machine, "{arch}: wrong architecture");
        hot_text_first(arch, &bin);
        let meta = std::fs::metadata(&bin).unwrap();
        assert!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0,
            "{arch}: binary not executable"
        );
        if arch == "arm64" {
            assert!(
                meta.len() <= 7 * MIB,
                "arm64 binary is {} bytes (> 7 MiB: the budget, BENCHMARKS table 13)",
                meta.len()
            );
        }

        // What the repository holds is what the package installs.
        for (inside, repo) in [
            ("etc/tidemark/tidemark.toml", "configs/tidemark.toml"),
            ("etc/tidemark/site.toml", "configs/site.toml"),
            (
                "usr/lib/sysusers.d/tidemark.conf",
                "systemd/tidemark.sysusers",
            ),
            (
                "usr/share/doc/tidemark/examples/greenhouse.toml",
                "configs/greenhouse.toml",
            ),
            (
                "usr/share/doc/tidemark/examples/factory.toml",
                "configs/factory.toml",
            ),
            (
                "usr/share/doc/tidemark/examples/example.toml",
                "configs/example.toml",
            ),
            (
                "usr/share/doc/tidemark/examples/local.toml",
                "configs/local.toml",
            ),
            ("usr/share/doc/tidemark/README.md", "README.md"),
            (
                "usr/share/doc/tidemark/contrib/grafana/tidemark.json",
                "contrib/grafana/tidemark.json",
            ),
            (
                "usr/share/doc/tidemark/contrib/prometheus/tidemark-rules.yml",
                "contrib/prometheus/tidemark-rules.yml",
            ),
        ] {
            assert_eq!(
                read(&t.join(inside)),
                read(&root().join(repo)),
                "{arch}: {inside} differs from {repo} (stale package? rerun scripts/build-deb.sh)"
            );
        }
        assert_eq!(
            read(&unit_path(t)),
            read(&root().join("systemd/tidemark.service")),
            "{arch}: unit differs from systemd/tidemark.service"
        );

        // Both config files are conffiles: dpkg keeps an edited one on upgrade.
        let conffiles = read(&t.join("DEBIAN/conffiles"));
        for f in ["/etc/tidemark/tidemark.toml", "/etc/tidemark/site.toml"] {
            assert!(
                conffiles.lines().any(|l| l == f),
                "{arch}: {f} not in conffiles:\n{conffiles}"
            );
        }
        // The user is created at install; the unit is registered but not enabled or started.
        let postinst = read(&t.join("DEBIAN/postinst"));
        assert!(postinst.contains("systemd-sysusers"), "{postinst}");
        assert!(postinst.contains("deb-systemd-helper"), "{postinst}");
        assert!(!postinst.contains("deb-systemd-invoke start"), "{postinst}");
        let sysusers = read(&t.join("usr/lib/sysusers.d/tidemark.conf"));
        assert!(sysusers.contains("u tidemark"), "{sysusers}");
    }
    // The amd64 binary runs here: it is this source's version.
    let tree = unpack(&deb("amd64"));
    let v = run(Command::new(tree.path().join("usr/bin/tidemark")).arg("--version"));
    assert_eq!(v.trim(), format!("tidemark {VERSION}"));
}

/// A root holding the host's own systemd units (targets the unit refers to),
/// the `kill` that `ExecReload=` runs (every Debian system has it), and the
/// package's files.
fn systemd_root(deb: &Path) -> tempfile::TempDir {
    let tree = unpack(deb);
    let bin = tree.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let kill = ["/bin/kill", "/usr/bin/kill"]
        .into_iter()
        .find(|k| Path::new(k).exists())
        .expect("kill(1): scripts/test.sh installs procps");
    run(Command::new("cp").arg("-L").arg(kill).arg(bin.join("kill")));
    let units = tree.path().join("usr/lib/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    for dir in ["/lib/systemd/system", "/usr/lib/systemd/system"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let to = units.join(e.file_name());
            if e.file_name() != "tidemark.service" && !to.exists() {
                run(Command::new("cp").arg("-a").arg(e.path()).arg(&to));
            }
        }
    }
    tree
}

#[test]
fn the_packaged_unit_passes_systemd_verify_and_security_review() {
    let tree = systemd_root(&deb("amd64"));
    let r = tree.path().to_str().unwrap();
    let verify = Command::new("systemd-analyze")
        .args(["verify", &format!("--root={r}"), "tidemark.service"])
        .output()
        .expect("systemd-analyze");
    let msgs = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && msgs.trim().is_empty(),
        "verify: {msgs}"
    );

    let out = run(Command::new("systemd-analyze").args([
        "security",
        "--offline=yes",
        &format!("--root={r}"),
        "tidemark.service",
    ]));
    let score: f64 = out
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for tidemark.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no exposure score in:\n{out}"));
    println!("systemd-analyze security --offline=yes: exposure {score}");
    assert!(score <= 2.0, "exposure {score} > 2.0:\n{out}");

    // The gateway can read the kernel's clock state (docs/reference.md#time) and cannot set the clock.
    let unit = read(&unit_path(tree.path()));
    let allowed = syscalls_allowed(&unit);
    for call in ["adjtimex", "clock_adjtime"] {
        assert!(allowed.contains(call), "{call} denied by the unit's filter");
    }
    for call in ["settimeofday", "clock_settime"] {
        assert!(
            !allowed.contains(call),
            "{call} allowed by the unit's filter"
        );
    }
    assert!(
        !unit.lines().any(|l| l.trim() == "ProtectClock=yes"),
        "ProtectClock=yes denies even reading adjtimex"
    );
    assert!(
        unit.lines().any(|l| l.trim() == "CapabilityBoundingSet="),
        "the unit must keep an empty capability set (no CAP_SYS_TIME)"
    );

    // The checks bite: a unit whose binary is missing fails verify.
    std::fs::remove_file(tree.path().join("usr/bin/tidemark")).unwrap();
    let broken = Command::new("systemd-analyze")
        .args(["verify", &format!("--root={r}"), "tidemark.service"])
        .output()
        .unwrap();
    assert!(
        !broken.status.success() || !broken.stderr.is_empty(),
        "verify passed without the binary"
    );
}

/// dpkg into a scratch root (own admin dir, scripts run chrootless with
/// DPKG_ROOT): install, edit the site file, upgrade, and the edit is kept.
#[test]
fn an_upgrade_keeps_the_edited_site_config() {
    let deb1 = deb("amd64");
    let work = tempfile::tempdir().unwrap();
    let scratch = work.path().join("root");
    let admin = scratch.join("var/lib/dpkg");
    for d in ["updates", "info", "triggers"] {
        std::fs::create_dir_all(admin.join(d)).unwrap();
    }
    std::fs::write(admin.join("status"), "").unwrap();
    std::fs::write(admin.join("available"), "").unwrap();
    let dpkg = |deb: &Path| {
        run(Command::new("dpkg")
            .arg(format!("--root={}", scratch.display()))
            .arg(format!("--admindir={}", admin.display()))
            .args([
                "--force-script-chrootless",
                "--force-not-root",
                "--force-depends",
                "--force-confold",
                "--log=/dev/null",
                "-i",
            ])
            .arg(deb)
            .env("DPKG_ROOT", &scratch))
    };
    dpkg(&deb1);
    // postinst made the service user (systemd-sysusers into the scratch root).
    let passwd = read(&scratch.join("etc/passwd"));
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("tidemark:") && l.contains(":/var/lib/tidemark:")),
        "no tidemark user in\n{passwd}"
    );
    let site = scratch.join("etc/tidemark/site.toml");
    assert_eq!(read(&site), read(&root().join("configs/site.toml")));
    let edited = read(&site).replace("id = \"edge-gw1\"", "id = \"greenhouse-7\"");
    std::fs::write(&site, &edited).unwrap();

    // The next version of the package: same files, a new version and a changed base config.
    let next = unpack(&deb1);
    let n = next.path();
    let control = read(&n.join("DEBIAN/control")).replace(
        &format!("Version: {VERSION}-1"),
        &format!("Version: {VERSION}-2"),
    );
    std::fs::write(n.join("DEBIAN/control"), control).unwrap();
    let base = n.join("etc/tidemark/tidemark.toml");
    std::fs::write(&base, read(&base) + "# changed in -2\n").unwrap();
    let sums_path = n.join("DEBIAN/md5sums");
    if sums_path.exists() {
        let md5 = run(Command::new("md5sum")
            .arg("etc/tidemark/tidemark.toml")
            .current_dir(n));
        let sums = read(&sums_path)
            .lines()
            .map(|l| {
                if l.ends_with("etc/tidemark/tidemark.toml") {
                    md5.trim()
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&sums_path, sums + "\n").unwrap();
    }
    let deb2 = work.path().join("tidemark_next.deb");
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-b"])
        .arg(n)
        .arg(&deb2));
    dpkg(&deb2);
    let status = run(Command::new("dpkg-query")
        .arg(format!("--admindir={}", admin.display()))
        .args(["-W", "-f=${Version}", "tidemark"]));
    assert_eq!(status, format!("{VERSION}-2"));
    assert_eq!(read(&site), edited, "the edited site config was replaced");
    assert!(
        read(&scratch.join("etc/tidemark/tidemark.toml")).ends_with("# changed in -2\n"),
        "an unedited base config follows the package"
    );
}

/// The system calls a unit's `SystemCallFilter=` lines allow, as systemd combines
/// them (the first line an allow list; `~` lines remove, later plain lines add),
/// with the groups expanded by `systemd-analyze syscall-filter`.
fn syscalls_allowed(unit: &str) -> std::collections::BTreeSet<String> {
    fn expand(name: &str, out: &mut std::collections::BTreeSet<String>) {
        if !name.starts_with('@') {
            out.insert(name.to_owned());
            return;
        }
        let listed = run(Command::new("systemd-analyze").args(["syscall-filter", name]));
        for l in listed.lines().skip(1).map(str::trim) {
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            expand(l, out);
        }
    }
    let mut allowed = std::collections::BTreeSet::new();
    for line in unit
        .lines()
        .filter_map(|l| l.trim().strip_prefix("SystemCallFilter="))
    {
        let (deny, names) = match line.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let mut set = std::collections::BTreeSet::new();
        for n in names.split_whitespace() {
            expand(n, &mut set);
        }
        if deny {
            allowed.retain(|c| !set.contains(c));
        } else {
            allowed.extend(set);
        }
    }
    allowed
}
