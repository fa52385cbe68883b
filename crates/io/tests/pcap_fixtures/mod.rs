//! Builders for hand-made capture files, shared by the `pcap_*` integration tests.
//!
//! Written from the format specifications, independently of the reader, so that a mistake in
//! one does not hide a mistake in the other. The literal-byte fixtures in the tests check these
//! builders in turn.
#![allow(dead_code)]

use flowstate_io::pcap::PcapReader;
use flowstate_io::{Error, PacketMeta};

/// Byte order of a hand-made file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    Le,
    Be,
}

impl Order {
    pub(crate) fn u16(self, v: u16) -> [u8; 2] {
        match self {
            Order::Le => v.to_le_bytes(),
            Order::Be => v.to_be_bytes(),
        }
    }
    pub(crate) fn u32(self, v: u32) -> [u8; 4] {
        match self {
            Order::Le => v.to_le_bytes(),
            Order::Be => v.to_be_bytes(),
        }
    }
}

/// Deterministic frame bytes: packet `i` of `len` bytes.
pub(crate) fn frame(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

/// Classic pcap file header.
pub(crate) fn pcap_header(o: Order, nanos: bool, snaplen: u32, linktype: u32) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend(o.u32(if nanos { 0xA1B2_3C4D } else { 0xA1B2_C3D4 }));
    v.extend(o.u16(2));
    v.extend(o.u16(4));
    v.extend(o.u32(0));
    v.extend(o.u32(0));
    v.extend(o.u32(snaplen));
    v.extend(o.u32(linktype));
    v
}

/// Classic pcap record.
pub(crate) fn pcap_record(o: Order, sec: u32, frac: u32, data: &[u8], orig: u32) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend(o.u32(sec));
    v.extend(o.u32(frac));
    v.extend(o.u32(data.len() as u32));
    v.extend(o.u32(orig));
    v.extend(data);
    v
}

/// A pcapng block of type `ty` around `body` (padded to 4 bytes).
pub(crate) fn block(o: Order, ty: u32, body: &[u8]) -> Vec<u8> {
    let padded = body.len().div_ceil(4) * 4;
    let len = (12 + padded) as u32;
    let mut v = Vec::new();
    v.extend(o.u32(ty));
    v.extend(o.u32(len));
    v.extend(body);
    v.resize(8 + padded, 0);
    v.extend(o.u32(len));
    v
}

/// A pcapng option (code, value padded to 4 bytes).
pub(crate) fn option(o: Order, code: u16, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend(o.u16(code));
    v.extend(o.u16(value.len() as u16));
    v.extend(value);
    v.resize(4 + value.len().div_ceil(4) * 4, 0);
    v
}

/// Section Header Block, version 1.0, unknown section length, one comment option.
pub(crate) fn shb(o: Order) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(o.u32(0x1A2B_3C4D));
    body.extend(o.u16(1));
    body.extend(o.u16(0));
    body.extend([0xFF; 8]);
    body.extend(option(o, 1, b"hand made"));
    body.extend(option(o, 0, &[]));
    block(o, 0x0A0D_0D0A, &body)
}

/// Interface Description Block with an optional `if_tsresol`.
pub(crate) fn idb(o: Order, linktype: u16, snaplen: u32, tsresol: Option<u8>) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(o.u16(linktype));
    body.extend(o.u16(0));
    body.extend(o.u32(snaplen));
    body.extend(option(o, 2, b"eth0"));
    if let Some(r) = tsresol {
        body.extend(option(o, 9, &[r]));
        body.extend(option(o, 0, &[]));
    }
    block(o, 1, &body)
}

/// Enhanced Packet Block; `ts` in the interface's units.
pub(crate) fn epb(o: Order, iface: u32, ts: u64, data: &[u8], orig: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(o.u32(iface));
    body.extend(o.u32((ts >> 32) as u32));
    body.extend(o.u32(ts as u32));
    body.extend(o.u32(data.len() as u32));
    body.extend(o.u32(orig));
    body.extend(data);
    body.resize(body.len().div_ceil(4) * 4, 0);
    body.extend(option(o, 1, b"epb comment"));
    body.extend(option(o, 0, &[]));
    block(o, 6, &body)
}

/// Simple Packet Block holding `data` (already cut to the snaplen) of original length `orig`.
pub(crate) fn spb(o: Order, orig: u32, data: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(o.u32(orig));
    body.extend(data);
    block(o, 3, &body)
}

/// Obsolete Packet Block.
pub(crate) fn opb(o: Order, iface: u16, ts: u64, data: &[u8], orig: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(o.u16(iface));
    body.extend(o.u16(0));
    body.extend(o.u32((ts >> 32) as u32));
    body.extend(o.u32(ts as u32));
    body.extend(o.u32(data.len() as u32));
    body.extend(o.u32(orig));
    body.extend(data);
    block(o, 2, &body)
}

/// Everything `next_packet` yields, and the error that ended it (if any).
pub(crate) fn read_all(bytes: &[u8]) -> (Vec<(Vec<u8>, PacketMeta)>, Option<Error>) {
    let mut r = match PcapReader::new(bytes, "mem.pcap") {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Some(e)),
    };
    let mut out = Vec::new();
    loop {
        match r.next_packet() {
            Ok(Some((d, m))) => out.push((d.to_vec(), m)),
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e)),
        }
    }
}

/// The offset and reason of a format error, panicking on anything else.
pub(crate) fn format_offset(e: &Error) -> (u64, &str) {
    match e {
        Error::Format { offset, reason, .. } => (*offset, reason.as_str()),
        other => panic!("expected a format error, got {other:?}"),
    }
}
