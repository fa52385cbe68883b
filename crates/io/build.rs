//! Compiles the XDP programs of `bpf/` with `clang -target bpf -O2 -g` into `OUT_DIR`, where
//! `src/bpf.rs` embeds them.
//!
//! Without clang or libbpf's headers (`bpf/bpf_helpers.h`, from libbpf-dev) the build goes on
//! with a warning and empty objects: the crate then works but for XDP, whose loading says that
//! this build has no XDP programs (`bash scripts/setup` installs what is missing). Cargo runs
//! this again when a file of `bpf/` changes, when `FLOWSTATE_CLANG` changes, and when clang or
//! the headers appear (the directories they would appear in are watched). With clang and the
//! headers there, a program that does not compile fails the build with clang's message.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The programs, by source file name (`bpf/NAME.bpf.c` becomes `OUT_DIR/NAME.bpf.o`).
const PROGRAMS: [&str; 3] = ["redirect", "flowcache", "pipeline"];

/// Where libbpf-dev puts its headers.
const INCLUDE_DIRS: [&str; 2] = ["/usr/include", "/usr/local/include"];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let src = manifest.join("bpf");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-env-changed=FLOWSTATE_CLANG");

    let clang = find_clang();
    let headers = INCLUDE_DIRS
        .iter()
        .map(|d| Path::new(d).join("bpf/bpf_helpers.h"))
        .find(|h| h.is_file());
    match &clang {
        Some(c) => println!("cargo:rerun-if-changed={}", c.display()),
        // Directories are watched by their contents' times: installing clang changes one.
        None => watch_clang_dirs(),
    }
    match &headers {
        Some(h) => println!("cargo:rerun-if-changed={}", h.display()),
        None => {
            for d in INCLUDE_DIRS.iter().filter(|d| Path::new(d).is_dir()) {
                println!("cargo:rerun-if-changed={d}");
            }
        }
    }

    let missing = match (clang.is_none(), headers.is_none()) {
        (false, false) => None,
        (true, true) => Some("clang and libbpf-dev (bpf/bpf_helpers.h) are"),
        (true, false) => Some("clang is"),
        (false, true) => Some("libbpf-dev (bpf/bpf_helpers.h) is"),
    };
    let (Some(clang), None) = (clang, missing) else {
        let missing = missing.unwrap_or_default();
        println!(
            "cargo:warning=building without the XDP programs: {missing} missing; \
             AF_XDP and the XDP fast path will be unavailable (run `bash scripts/setup` and rebuild)"
        );
        for name in PROGRAMS {
            write_empty(&out.join(format!("{name}.bpf.o")));
        }
        return;
    };

    // linux/types.h includes asm/types.h, which Debian keeps under the target's multiarch
    // directory.
    let multiarch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => Some("x86_64-linux-gnu"),
        Ok("aarch64") => Some("aarch64-linux-gnu"),
        Ok("riscv64") => Some("riscv64-linux-gnu"),
        Ok("powerpc64") => Some("powerpc64le-linux-gnu"),
        Ok("s390x") => Some("s390x-linux-gnu"),
        _ => None,
    };
    for name in PROGRAMS {
        let source = src.join(format!("{name}.bpf.c"));
        let object = out.join(format!("{name}.bpf.o"));
        let mut cmd = Command::new(&clang);
        cmd.args(["-target", "bpf", "-O2", "-g", "-Wall"]);
        for d in INCLUDE_DIRS {
            if let Some(m) = multiarch {
                let dir = Path::new(d).join(m);
                if dir.is_dir() {
                    cmd.arg("-I").arg(dir);
                }
            }
        }
        cmd.arg("-I").arg(&src);
        cmd.arg("-c").arg(&source).arg("-o").arg(&object);
        let output = cmd
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", clang.display()));
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            panic!(
                "clang could not compile {} ({}):\n{stderr}",
                source.display(),
                output.status
            );
        }
        for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
            println!("cargo:warning={line}");
        }
    }
}

/// `FLOWSTATE_CLANG` (a path or a name to look up in `PATH`; empty: no clang), else `clang`
/// in `PATH`.
fn find_clang() -> Option<PathBuf> {
    let wanted = env::var_os("FLOWSTATE_CLANG").unwrap_or_else(|| "clang".into());
    let wanted = Path::new(&wanted);
    if wanted.as_os_str().is_empty() {
        return None;
    }
    if wanted.components().count() > 1 {
        return wanted.is_file().then(|| wanted.to_owned());
    }
    env::split_paths(&env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(wanted))
        .find(|p| p.is_file())
}

/// Watches the directories clang would appear in: `FLOWSTATE_CLANG`'s, if it is a path,
/// else the absolute directories of `PATH`.
fn watch_clang_dirs() {
    let wanted = env::var_os("FLOWSTATE_CLANG").unwrap_or_default();
    let wanted = Path::new(&wanted);
    let dirs: Vec<PathBuf> = if wanted.components().count() > 1 {
        wanted.parent().map(Path::to_owned).into_iter().collect()
    } else {
        env::split_paths(&env::var_os("PATH").unwrap_or_default()).collect()
    };
    for d in dirs {
        if d.is_absolute() && d.is_dir() {
            println!("cargo:rerun-if-changed={}", d.display());
        }
    }
}

fn write_empty(path: &Path) {
    std::fs::write(path, b"").unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
