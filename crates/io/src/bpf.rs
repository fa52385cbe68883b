//! The XDP programs of `crates/io/bpf/`, compiled by the build script with
//! `clang -target bpf -O2 -g` and embedded here, and what loading and testing them needs: the
//! [`aya`] loader (ELF parsing, maps, relocation, verification) behind this crate's errors, and
//! `BPF_PROG_TEST_RUN`, which aya does not wrap, with a typed `bpf_attr`.
//!
//! A build made without clang or libbpf's headers embeds no programs: loading one is then an
//! [`Error::Device`] that says so and how to fix it.

use crate::afxdp::device_error;
use crate::{Error, Result};
use aya::programs::{ProgramError, Xdp};
use aya::{Ebpf, EbpfLoader};
use std::io;
use std::os::fd::RawFd;

/// `bpf/redirect.bpf.c`: every frame to the XDP socket of its queue.
pub(crate) const REDIRECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/redirect.bpf.o"));
/// `bpf/flowcache.bpf.c`: the whole-chain flow cache (loaded by `flowstate-fastpath`).
pub const FLOWCACHE: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/flowcache.bpf.o"));
/// `bpf/pipeline.bpf.c`: HyperSFC's table pipeline (loaded by `flowstate-fastpath`).
pub const PIPELINE: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pipeline.bpf.o"));

/// What a build without the programs says when one is loaded.
pub(crate) const NO_PROGRAMS: &str = "this build has no XDP programs: clang and libbpf-dev were \
     missing when it was built; run `bash scripts/setup` and rebuild";

/// Loads `object` (one of the constants above) with its maps sized by `max_entries`, and
/// verifies its XDP program `program`. Failures are errors of `device` while doing `what`.
pub fn load_xdp(
    object: &[u8],
    program: &str,
    max_entries: &[(&'static str, u32)],
    device: &str,
    what: &str,
) -> Result<Ebpf> {
    if object.is_empty() {
        return Err(Error::Device {
            device: device.to_owned(),
            what: what.into(),
            source: io::Error::new(io::ErrorKind::Unsupported, NO_PROGRAMS),
        });
    }
    let mut loader = EbpfLoader::new();
    for &(map, n) in max_entries {
        loader.map_max_entries(map, n);
    }
    let mut ebpf = loader.load(object).map_err(|e| aya_err(device, what, &e))?;
    xdp(&mut ebpf, program)
        .and_then(|p| p.load())
        .map_err(|e| aya_err(device, what, &e))?;
    Ok(ebpf)
}

/// The map `name` of `ebpf`, taken out of it as an `M`. Failures are errors of `device` while
/// doing `what`.
pub fn take_map<M: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &str,
    device: &str,
    what: &str,
) -> Result<M> {
    let map = ebpf.take_map(name).ok_or_else(|| Error::Device {
        device: device.to_owned(),
        what: what.into(),
        source: io::Error::other(format!("the object has no map `{name}`")),
    })?;
    M::try_from(map).map_err(|e| aya_err(device, what, &e))
}

/// The XDP program `name` of `ebpf`.
pub fn xdp<'a>(ebpf: &'a mut Ebpf, name: &str) -> std::result::Result<&'a mut Xdp, ProgramError> {
    ebpf.program_mut(name)
        .ok_or(ProgramError::InvalidName {
            name: name.to_owned(),
        })?
        .try_into()
}

/// An error of aya's as this crate's: the system's error number kept (so that the hints of
/// [`device_error`] apply), aya's explanation with it, and of a verifier's refusal the log's end.
pub fn aya_err(device: &str, what: &str, e: &(dyn std::error::Error + 'static)) -> Error {
    let mut code = None;
    let mut verifier = false;
    let mut text = Vec::new();
    let mut at = Some(e);
    while let Some(err) = at {
        if let Some(ProgramError::LoadError {
            io_error,
            verifier_log,
        }) = err.downcast_ref::<ProgramError>()
        {
            code = io_error.raw_os_error();
            let log = verifier_log.to_string();
            verifier = !log.trim().is_empty();
            let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
            let tail = &lines[lines.len().saturating_sub(12)..];
            text.push(format!(
                "{io_error}; the verifier said: {}",
                tail.join(" | ")
            ));
            break;
        }
        if let Some(io) = err.downcast_ref::<io::Error>() {
            code = code.or(io.raw_os_error());
        }
        let s = err.to_string();
        if !text.iter().any(|t: &String| t.contains(&s)) {
            text.push(s);
        }
        at = err.source();
    }
    let text = text.join(": ");
    let source = match code {
        Some(c) => io::Error::new(io::Error::from_raw_os_error(c).kind(), text),
        None => io::Error::other(text),
    };
    // A program the verifier refused is no missing privilege: no hint for its error number.
    device_error(device, what, code.filter(|_| !verifier), source)
}

/// `struct xdp_md` as `BPF_PROG_TEST_RUN` takes it for the context (linux/bpf.h).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

/// The `test` member of `union bpf_attr` (linux/bpf.h), for `BPF_PROG_TEST_RUN`.
#[repr(C)]
#[derive(Debug, Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Runs the XDP program `prog` once on `frame` received on `ingress_ifindex` (queue 0) with
/// `BPF_PROG_TEST_RUN` (the kernel's own interpreter or JIT, no interface needed): returns the
/// XDP action and the frame as the program left it.
pub fn test_run(prog: RawFd, ingress_ifindex: u32, frame: &[u8]) -> io::Result<(u32, Vec<u8>)> {
    test_run_repeated(prog, ingress_ifindex, frame, 1).map(|(action, out, _)| (action, out))
}

/// As [`test_run`], `repeat` times in the kernel on the same buffer (a program that rewrites
/// the frame sees its own output from the second run on); also returns the kernel's average
/// time per run, in nanoseconds.
pub fn test_run_repeated(
    prog: RawFd,
    ingress_ifindex: u32,
    frame: &[u8],
    repeat: u32,
) -> io::Result<(u32, Vec<u8>, u32)> {
    let mut out = vec![0u8; frame.len() + 256];
    let ctx = XdpMd {
        data_end: frame.len() as u32,
        ingress_ifindex,
        ..XdpMd::default()
    };
    let mut attr = TestRunAttr {
        prog_fd: prog as u32,
        data_size_in: frame.len() as u32,
        data_size_out: out.len() as u32,
        data_in: frame.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: repeat.max(1),
        ctx_size_in: std::mem::size_of::<XdpMd>() as u32,
        ctx_in: &ctx as *const XdpMd as u64,
        ..TestRunAttr::default()
    };
    // SAFETY: attr is a bpf_attr prefix for BPF_PROG_TEST_RUN whose pointers are valid for
    // the sizes given (frame and ctx read, out written) during the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestRunAttr,
            std::mem::size_of::<TestRunAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    out.truncate(attr.data_size_out as usize);
    Ok((attr.retval, out, attr.duration))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn the_test_run_attr_is_laid_out_like_the_kernels() {
        // linux/bpf.h, union bpf_attr, struct { ... } test.
        assert_eq!(offset_of!(TestRunAttr, retval), 4);
        assert_eq!(offset_of!(TestRunAttr, data_size_out), 12);
        assert_eq!(offset_of!(TestRunAttr, data_in), 16);
        assert_eq!(offset_of!(TestRunAttr, data_out), 24);
        assert_eq!(offset_of!(TestRunAttr, repeat), 32);
        assert_eq!(offset_of!(TestRunAttr, ctx_size_in), 40);
        assert_eq!(offset_of!(TestRunAttr, ctx_in), 48);
        assert_eq!(offset_of!(TestRunAttr, flags), 64);
        assert_eq!(offset_of!(TestRunAttr, batch_size), 72);
        assert_eq!(size_of::<TestRunAttr>(), 80);
        assert_eq!(offset_of!(XdpMd, ingress_ifindex), 12);
        assert_eq!(size_of::<XdpMd>(), 24);
    }

    #[test]
    fn a_build_says_whether_it_has_the_programs() {
        // Every object is there, or none (the build script writes empty ones without clang).
        assert_eq!(REDIRECT.is_empty(), FLOWCACHE.is_empty());
        assert_eq!(REDIRECT.is_empty(), PIPELINE.is_empty());
        if REDIRECT.is_empty() {
            let e = load_xdp(REDIRECT, "redirect", &[], "lo", "loading").unwrap_err();
            assert!(e.to_string().contains(NO_PROGRAMS), "{e}");
        }
    }
}
