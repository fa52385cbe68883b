//! Capture files: reading classic pcap and pcapng, writing classic pcap.
//!
//! Formats, implemented from their specifications (no third-party code):
//! * classic pcap (draft-ietf-opsawg-pcap): magic `0xA1B2C3D4` (microsecond timestamps) and
//!   `0xA1B23C4D` (nanosecond timestamps), version 2.4, either byte order;
//! * pcapng (draft-ietf-opsawg-pcapng): Section Header Block (§4.1) in either byte order,
//!   Interface Description Block (§4.2) with its `if_tsresol` (power of 10 or of 2) and
//!   `if_tsoffset` options, Enhanced Packet Block (§4.3), Simple Packet Block (§4.4), the obsolete
//!   Packet Block (Appendix A); every other block type is skipped by its length; a file may hold
//!   several sections.
//!
//! Promises:
//! * No input makes the reader panic, and no length field makes it allocate more than
//!   [`MAX_BLOCK_LEN`]: captured lengths are checked against [`MAX_CAPLEN`] and block lengths
//!   against their minimum, their alignment and [`MAX_BLOCK_LEN`] before anything is read.
//! * A damaged file gives [`Error::Format`] naming the byte offset where the damaged record or
//!   block starts. Packets before it are delivered first: [`Source::recv`] returns the packets it
//!   gathered and reports the error on the next call. A file that ends exactly at a record
//!   boundary simply ends.
//! * Reading uses one record buffer, reused for every packet: no allocation per packet.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::{Error, PacketBatch, PacketMeta, Result, Sink, Source};

/// `LINKTYPE_ETHERNET`: IEEE 802.3 Ethernet frames, the link type flowstate processes.
pub const LINKTYPE_ETHERNET: u32 = 1;

/// Largest captured length the reader accepts in one record (libpcap's `MAXIMUM_SNAPLEN`);
/// a larger one is taken as a damaged length field.
pub const MAX_CAPLEN: u32 = 256 * 1024;

/// Largest pcapng block the reader buffers (section, interface and packet blocks); other blocks
/// are skipped without being buffered and may be of any length.
pub const MAX_BLOCK_LEN: u32 = 16 * 1024 * 1024;

/// Snapshot length written by [`PcapWriter`] unless told otherwise.
pub const DEFAULT_SNAPLEN: u32 = 262_144;

/// Classic pcap magic, microsecond timestamps.
const MAGIC_MICROS: u32 = 0xA1B2_C3D4;
/// Classic pcap magic, nanosecond timestamps.
const MAGIC_NANOS: u32 = 0xA1B2_3C4D;
/// Classic pcap version we read and write.
const PCAP_VERSION: (u16, u16) = (2, 4);

/// pcapng Section Header Block type; a palindrome, so the same in both byte orders.
const NG_SHB: u32 = 0x0A0D_0D0A;
/// pcapng byte-order magic in the Section Header Block.
const NG_BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
/// pcapng Interface Description Block.
const NG_IDB: u32 = 1;
/// pcapng (obsolete) Packet Block.
const NG_OPB: u32 = 2;
/// pcapng Simple Packet Block.
const NG_SPB: u32 = 3;
/// pcapng Enhanced Packet Block.
const NG_EPB: u32 = 6;
/// Option codes (pcapng §3.5, §4.2).
const OPT_ENDOFOPT: u16 = 0;
const OPT_IF_TSRESOL: u16 = 9;
const OPT_IF_TSOFFSET: u16 = 14;

/// Minimum total lengths of pcapng blocks: header (8) + fixed fields + trailer (4).
const NG_MIN_BLOCK: u32 = 12;
const NG_MIN_SHB: u32 = 28;
const NG_MIN_IDB: u32 = 20;
const NG_MIN_EPB: u32 = 32;
const NG_MIN_SPB: u32 = 16;
const NG_MIN_OPB: u32 = 32;

/// Size of the read and write buffers.
const IO_BUFFER: usize = 64 * 1024;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The container format of a capture file, detected from its first four bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileFormat {
    /// Classic libpcap format (one link type, one timestamp resolution per file).
    Pcap,
    /// pcapng: blocks, sections and interfaces.
    PcapNg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endian {
    Little,
    Big,
}

impl Endian {
    fn u16(self, b: &[u8], at: usize) -> u16 {
        let a = [b[at], b[at + 1]];
        match self {
            Endian::Little => u16::from_le_bytes(a),
            Endian::Big => u16::from_be_bytes(a),
        }
    }

    fn u32(self, b: &[u8], at: usize) -> u32 {
        let a = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        match self {
            Endian::Little => u32::from_le_bytes(a),
            Endian::Big => u32::from_be_bytes(a),
        }
    }

    fn u64(self, b: &[u8], at: usize) -> u64 {
        let (hi, lo) = match self {
            Endian::Little => (self.u32(b, at + 4), self.u32(b, at)),
            Endian::Big => (self.u32(b, at), self.u32(b, at + 4)),
        };
        (u64::from(hi) << 32) | u64::from(lo)
    }
}

/// How an interface's timestamp units become nanoseconds (`if_tsresol`, pcapng §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TsScale {
    /// Units of 10^-k s with k <= 9: multiply.
    Mul(u64),
    /// Units of 10^-k s with k > 9: divide.
    Div(u128),
    /// Units of 2^-k s: times 10^9, shifted right by k.
    Pow2(u32),
    /// Units so small that every timestamp is below a nanosecond.
    Zero,
}

impl TsScale {
    /// The default resolution: microseconds.
    const MICROS: TsScale = TsScale::Mul(1_000);

    fn from_tsresol(v: u8) -> TsScale {
        if v & 0x80 == 0 {
            let k = u32::from(v);
            if k <= 9 {
                TsScale::Mul(10u64.pow(9 - k))
            } else {
                10u128
                    .checked_pow(k - 9)
                    .map_or(TsScale::Zero, TsScale::Div)
            }
        } else {
            TsScale::Pow2(u32::from(v & 0x7f))
        }
    }

    fn to_ns(self, ts: u64) -> u128 {
        let ts = u128::from(ts);
        match self {
            TsScale::Mul(m) => ts * u128::from(m),
            TsScale::Div(d) => ts / d,
            // ts < 2^64 and 10^9 < 2^30, so the product fits; k <= 127.
            TsScale::Pow2(k) => (ts * u128::from(NANOS_PER_SEC)) >> k,
            TsScale::Zero => 0,
        }
    }
}

/// An interface of the current pcapng section.
#[derive(Debug, Clone, Copy)]
struct Interface {
    linktype: u32,
    snaplen: u32,
    scale: TsScale,
    /// `if_tsoffset`, in nanoseconds.
    offset_ns: i128,
}

impl Interface {
    fn timestamp_ns(&self, ts: u64) -> u64 {
        let ns = self.scale.to_ns(ts) as i128 + self.offset_ns;
        ns.clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// A packet sitting in the record buffer.
#[derive(Debug, Clone, Copy)]
struct Record {
    start: usize,
    len: usize,
    meta: PacketMeta,
    linktype: u32,
}

/// Reads a classic pcap or pcapng capture (format detected from the magic number).
///
/// Packets come out through [`Source::recv`] (copied into a [`PacketBatch`]) or one at a time
/// through [`next_packet`](Self::next_packet). Timestamps become nanoseconds since the Unix
/// epoch; `wire_len` is the original length (never less than the captured length); `port` is 0.
///
/// Link types: [`linktype`](Self::linktype) is the file's (for pcapng, the first interface's).
/// A pcapng file may declare interfaces of different link types; [`recv`](Source::recv) never
/// mixes link types in one batch, and [`last_linktype`](Self::last_linktype) names the link type
/// of the packets last returned.
///
/// After an error every further call returns that error again.
pub struct PcapReader<R = File> {
    rd: BufReader<R>,
    path: PathBuf,
    /// Offset of the next byte to read.
    pos: u64,
    /// The record buffer; its length is a high-water mark, never shrunk.
    buf: Vec<u8>,
    format: FileFormat,
    endian: Endian,
    /// Classic pcap: nanosecond timestamps.
    nanos: bool,
    /// pcapng: interfaces of the current section.
    interfaces: Vec<Interface>,
    linktype: u32,
    last_linktype: u32,
    /// A record read by `recv` but left for the next call (its link type differs).
    held: Option<Record>,
    /// An error found by `recv` after it had gathered packets, for the next call.
    pending: Option<Error>,
    /// Once an error was returned: a copy to return again.
    failed: Option<Error>,
    done: bool,
    records: u64,
}

impl<R> fmt::Debug for PcapReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PcapReader")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("linktype", &self.linktype)
            .field("offset", &self.pos)
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl PcapReader<File> {
    /// Opens the capture file at `path` and reads its header (for pcapng, up to its first
    /// interface description).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        PcapReader::new(file, path)
    }
}

impl<R: Read> PcapReader<R> {
    /// Reads a capture from `reader` (buffered here; no need to wrap it), naming it
    /// `name_for_errors` in errors. Reads the header (for pcapng, up to the first interface
    /// description) before returning.
    pub fn new(reader: R, name_for_errors: impl Into<PathBuf>) -> Result<Self> {
        let mut r = PcapReader {
            rd: BufReader::with_capacity(IO_BUFFER, reader),
            path: name_for_errors.into(),
            pos: 0,
            buf: Vec::with_capacity(IO_BUFFER),
            format: FileFormat::Pcap,
            endian: Endian::Little,
            nanos: false,
            interfaces: Vec::new(),
            linktype: LINKTYPE_ETHERNET,
            last_linktype: LINKTYPE_ETHERNET,
            held: None,
            pending: None,
            failed: None,
            done: false,
            records: 0,
        };
        let (magic, n) = r.read_array::<4>()?;
        match n {
            0 => return Err(r.format_error(0, "empty file: no pcap or pcapng header".into())),
            4 => {}
            _ => return Err(r.format_error(0, format!("truncated file header ({n} of 4 bytes)"))),
        }
        if u32::from_le_bytes(magic) == NG_SHB {
            r.format = FileFormat::PcapNg;
            r.start_pcapng()?;
        } else {
            r.start_pcap(magic)?;
        }
        r.last_linktype = r.linktype;
        Ok(r)
    }

    /// The next packet (bytes in the reader's buffer, valid until the next call) and its
    /// metadata; `Ok(None)` at the end of the file.
    pub fn next_packet(&mut self) -> Result<Option<(&[u8], PacketMeta)>> {
        let Some(rec) = self.next_record()? else {
            return Ok(None);
        };
        self.records += 1;
        self.last_linktype = rec.linktype;
        Ok(Some((&self.buf[rec.start..rec.start + rec.len], rec.meta)))
    }

    /// Classic pcap: the header's link type. pcapng: the first interface's; a pcapng file that
    /// declares no interface at all (hence holds no packet) reports [`LINKTYPE_ETHERNET`].
    pub fn linktype(&self) -> u32 {
        self.linktype
    }

    /// Link type of the packets last returned by [`next_packet`](Self::next_packet) or
    /// [`recv`](Source::recv) (before any, [`linktype`](Self::linktype)). Differs from
    /// `linktype()` only in pcapng files with interfaces of several link types.
    pub fn last_linktype(&self) -> u32 {
        self.last_linktype
    }

    /// The container format, detected from the magic number.
    pub fn format(&self) -> FileFormat {
        self.format
    }

    /// Number of packet records returned so far.
    pub fn records_read(&self) -> u64 {
        self.records
    }

    /// The name used in errors (the path for [`open`](PcapReader::open)).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of the file consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.pos
    }

    // ---- record sequencing ----

    fn next_record(&mut self) -> Result<Option<Record>> {
        if let Some(rec) = self.held.take() {
            return Ok(Some(rec));
        }
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        if let Some(e) = &self.failed {
            return Err(copy_error(e));
        }
        if self.done {
            return Ok(None);
        }
        let r = match self.format {
            FileFormat::Pcap => self.next_pcap_record(),
            FileFormat::PcapNg => self.next_block(false),
        };
        match r {
            Ok(None) => {
                self.done = true;
                Ok(None)
            }
            Ok(rec) => Ok(rec),
            Err(e) => {
                self.failed = Some(copy_error(&e));
                Err(e)
            }
        }
    }

    // ---- low-level reading ----

    fn format_error(&self, offset: u64, reason: String) -> Error {
        Error::Format {
            path: self.path.clone(),
            offset,
            reason,
        }
    }

    fn io_error(&self, source: io::Error) -> Error {
        Error::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Reads up to `N` bytes; fewer only at the end of the input. Returns them and the count.
    fn read_array<const N: usize>(&mut self) -> Result<([u8; N], usize)> {
        let mut a = [0u8; N];
        let n = read_full(&mut self.rd, &mut a).map_err(|e| self.io_error(e))?;
        self.pos += n as u64;
        Ok((a, n))
    }

    /// Reads up to `n` bytes into `buf[..n]`; fewer only at the end of the input.
    fn read_body(&mut self, n: usize) -> Result<usize> {
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        let got = read_full(&mut self.rd, &mut self.buf[..n]).map_err(|e| self.io_error(e))?;
        self.pos += got as u64;
        Ok(got)
    }

    /// Skips up to `n` bytes; fewer only at the end of the input.
    fn skip(&mut self, n: u64) -> Result<u64> {
        let got =
            io::copy(&mut (&mut self.rd).take(n), &mut io::sink()).map_err(|e| self.io_error(e))?;
        self.pos += got;
        Ok(got)
    }

    // ---- classic pcap ----

    fn start_pcap(&mut self, magic: [u8; 4]) -> Result<()> {
        let (endian, nanos) = match (u32::from_le_bytes(magic), u32::from_be_bytes(magic)) {
            (MAGIC_MICROS, _) => (Endian::Little, false),
            (MAGIC_NANOS, _) => (Endian::Little, true),
            (_, MAGIC_MICROS) => (Endian::Big, false),
            (_, MAGIC_NANOS) => (Endian::Big, true),
            (_, be) => {
                return Err(
                    self.format_error(0, format!("bad magic 0x{be:08x}: neither pcap nor pcapng"))
                )
            }
        };
        self.endian = endian;
        self.nanos = nanos;
        let (h, n) = self.read_array::<20>()?;
        if n < 20 {
            return Err(self.format_error(
                0,
                format!("truncated pcap file header ({} of 24 bytes)", n + 4),
            ));
        }
        let version = (endian.u16(&h, 0), endian.u16(&h, 2));
        if version != PCAP_VERSION {
            return Err(self.format_error(
                0,
                format!(
                    "unsupported pcap version {}.{} (expected 2.4)",
                    version.0, version.1
                ),
            ));
        }
        // The low 16 bits are the link type; the upper ones carry FCS information.
        self.linktype = endian.u32(&h, 16) & 0xFFFF;
        Ok(())
    }

    fn next_pcap_record(&mut self) -> Result<Option<Record>> {
        let start = self.pos;
        let (h, n) = self.read_array::<16>()?;
        match n {
            0 => return Ok(None),
            16 => {}
            _ => {
                return Err(
                    self.format_error(start, format!("truncated record header ({n} of 16 bytes)"))
                )
            }
        }
        let e = self.endian;
        let (sec, frac, caplen, origlen) =
            (e.u32(&h, 0), e.u32(&h, 4), e.u32(&h, 8), e.u32(&h, 12));
        if caplen > MAX_CAPLEN {
            return Err(self.format_error(
                start,
                format!("captured length {caplen} exceeds the maximum {MAX_CAPLEN}"),
            ));
        }
        let got = self.read_body(caplen as usize)?;
        if got < caplen as usize {
            return Err(self.format_error(
                start,
                format!("truncated packet data ({got} of {caplen} bytes)"),
            ));
        }
        let frac_ns = if self.nanos {
            u64::from(frac)
        } else {
            u64::from(frac) * 1_000
        };
        Ok(Some(Record {
            start: 0,
            len: caplen as usize,
            meta: PacketMeta {
                timestamp_ns: u64::from(sec) * NANOS_PER_SEC + frac_ns,
                wire_len: origlen.max(caplen),
                ..PacketMeta::default()
            },
            linktype: self.linktype,
        }))
    }

    // ---- pcapng ----

    /// Reads the first Section Header Block (its type is already read) and the blocks after it
    /// up to the first Interface Description Block, which sets [`linktype`](Self::linktype).
    fn start_pcapng(&mut self) -> Result<()> {
        let (len, n) = self.read_array::<4>()?;
        if n < 4 {
            return Err(
                self.format_error(0, format!("truncated block header ({} of 8 bytes)", n + 4))
            );
        }
        let mut header = [0u8; 8];
        header[..4].copy_from_slice(&NG_SHB.to_le_bytes());
        header[4..].copy_from_slice(&len);
        self.read_section_header(0, header)?;
        self.next_block(true)?;
        if let Some(first) = self.interfaces.first() {
            self.linktype = first.linktype;
        }
        Ok(())
    }

    /// Reads blocks until a packet (returned) or the end of the input. With `until_interface`,
    /// stops (returning `None`) after the first Interface Description Block instead.
    fn next_block(&mut self, until_interface: bool) -> Result<Option<Record>> {
        loop {
            let start = self.pos;
            let (h, n) = self.read_array::<8>()?;
            match n {
                0 => return Ok(None),
                8 => {}
                _ => {
                    return Err(self
                        .format_error(start, format!("truncated block header ({n} of 8 bytes)")))
                }
            }
            if u32::from_le_bytes([h[0], h[1], h[2], h[3]]) == NG_SHB {
                self.read_section_header(start, h)?;
                continue;
            }
            let e = self.endian;
            let (ty, len) = (e.u32(&h, 0), e.u32(&h, 4));
            let min = match ty {
                NG_IDB => NG_MIN_IDB,
                NG_EPB => NG_MIN_EPB,
                NG_SPB => NG_MIN_SPB,
                NG_OPB => NG_MIN_OPB,
                _ => NG_MIN_BLOCK,
            };
            let buffered = matches!(ty, NG_IDB | NG_EPB | NG_SPB | NG_OPB);
            self.check_block_len(start, ty, len, min, buffered)?;
            match ty {
                NG_IDB => {
                    let content = self.read_block_body(start, len)?;
                    self.interface_description(start, content)?;
                    if until_interface {
                        return Ok(None);
                    }
                }
                NG_EPB | NG_OPB => {
                    let content = self.read_block_body(start, len)?;
                    return self.packet_block(start, ty, content).map(Some);
                }
                NG_SPB => {
                    let content = self.read_block_body(start, len)?;
                    return self.simple_packet_block(start, content).map(Some);
                }
                _ => {
                    let body = u64::from(len - NG_MIN_BLOCK);
                    let got = self.skip(body)?;
                    let (trailer, n) = self.read_array::<4>()?;
                    if got < body || n < 4 {
                        return Err(self.truncated_block(start, len));
                    }
                    self.check_trailer(start, len, e.u32(&trailer, 0))?;
                }
            }
        }
    }

    /// Checks a block's total length: aligned, at least `min`, and at most [`MAX_BLOCK_LEN`]
    /// when the block is to be `buffered`.
    fn check_block_len(
        &self,
        start: u64,
        ty: u32,
        len: u32,
        min: u32,
        buffered: bool,
    ) -> Result<()> {
        if !len.is_multiple_of(4) {
            return Err(self.format_error(
                start,
                format!("block length {len} is not a multiple of 4 (block type 0x{ty:08x})"),
            ));
        }
        if len < min {
            return Err(self.format_error(
                start,
                format!(
                    "block length {len} is less than the minimum {min} for block type 0x{ty:08x}"
                ),
            ));
        }
        if buffered && len > MAX_BLOCK_LEN {
            return Err(self.format_error(
                start,
                format!("block length {len} exceeds the maximum {MAX_BLOCK_LEN} (block type 0x{ty:08x})"),
            ));
        }
        Ok(())
    }

    fn truncated_block(&self, start: u64, len: u32) -> Error {
        let got = self.pos - start;
        self.format_error(start, format!("truncated block ({got} of {len} bytes)"))
    }

    fn check_trailer(&self, start: u64, len: u32, trailer: u32) -> Result<()> {
        if trailer != len {
            return Err(self.format_error(
                start,
                format!("block's trailing length {trailer} differs from its leading length {len}"),
            ));
        }
        Ok(())
    }

    /// Reads the rest of a block whose 8-byte header is read, checks the trailing length and
    /// returns the length of its content (the fixed fields, data and options), which starts at
    /// `buf[0]`.
    fn read_block_body(&mut self, start: u64, len: u32) -> Result<usize> {
        let rest = (len - 8) as usize;
        let got = self.read_body(rest)?;
        if got < rest {
            return Err(self.truncated_block(start, len));
        }
        let content = rest - 4;
        self.check_trailer(start, len, self.endian.u32(&self.buf, content))?;
        Ok(content)
    }

    /// A Section Header Block at `start` whose 8 header bytes are read: sets the byte order and
    /// starts a section without interfaces.
    fn read_section_header(&mut self, start: u64, h: [u8; 8]) -> Result<()> {
        let (bom, n) = self.read_array::<4>()?;
        if n < 4 {
            return Err(self.format_error(
                start,
                format!(
                    "truncated section header block ({} of {NG_MIN_SHB} bytes)",
                    n + 8
                ),
            ));
        }
        let endian = if u32::from_le_bytes(bom) == NG_BYTE_ORDER_MAGIC {
            Endian::Little
        } else if u32::from_be_bytes(bom) == NG_BYTE_ORDER_MAGIC {
            Endian::Big
        } else {
            return Err(self.format_error(
                start,
                format!(
                    "bad byte-order magic 0x{:08x} in section header block",
                    u32::from_be_bytes(bom)
                ),
            ));
        };
        let len = endian.u32(&h, 4);
        self.check_block_len(start, NG_SHB, len, NG_MIN_SHB, true)?;
        let rest = (len - 12) as usize;
        let got = self.read_body(rest)?;
        if got < rest {
            return Err(self.truncated_block(start, len));
        }
        self.check_trailer(start, len, endian.u32(&self.buf, rest - 4))?;
        let (major, minor) = (endian.u16(&self.buf, 0), endian.u16(&self.buf, 2));
        // 1.0 is the only version; some old writers put 1.2, which readers treat as 1.0.
        if major != 1 || !(minor == 0 || minor == 2) {
            return Err(self.format_error(
                start,
                format!("unsupported pcapng version {major}.{minor} (expected 1.0)"),
            ));
        }
        self.endian = endian;
        self.interfaces.clear();
        Ok(())
    }

    /// An Interface Description Block whose content is `buf[..content]` (pcapng §4.2).
    fn interface_description(&mut self, start: u64, content: usize) -> Result<()> {
        let e = self.endian;
        let b = &self.buf[..content];
        let mut iface = Interface {
            linktype: u32::from(e.u16(b, 0)),
            snaplen: e.u32(b, 4),
            scale: TsScale::MICROS,
            offset_ns: 0,
        };
        let mut opts = &b[8..];
        while opts.len() >= 4 {
            let (code, olen) = (e.u16(opts, 0), usize::from(e.u16(opts, 2)));
            if code == OPT_ENDOFOPT {
                break;
            }
            let Some(value) = opts.get(4..4 + olen) else {
                return Err(self.format_error(
                    start,
                    format!("interface option {code} of {olen} bytes overruns its block"),
                ));
            };
            match (code, olen) {
                (OPT_IF_TSRESOL, 1) => iface.scale = TsScale::from_tsresol(value[0]),
                (OPT_IF_TSOFFSET, 8) => {
                    iface.offset_ns = i128::from(e.u64(value, 0) as i64) * i128::from(NANOS_PER_SEC)
                }
                (OPT_IF_TSRESOL | OPT_IF_TSOFFSET, _) => {
                    return Err(self.format_error(
                        start,
                        format!("interface option {code} has a bad length {olen}"),
                    ))
                }
                _ => {}
            }
            let next = (4 + olen + 3) & !3;
            opts = opts.get(next..).unwrap_or_default();
        }
        self.interfaces.push(iface);
        Ok(())
    }

    fn interface(&self, start: u64, id: u32) -> Result<Interface> {
        match self.interfaces.get(id as usize) {
            Some(i) => Ok(*i),
            None => Err(self.format_error(
                start,
                format!(
                    "packet refers to interface {id} but the section declares {}",
                    self.interfaces.len()
                ),
            )),
        }
    }

    fn check_caplen(&self, start: u64, caplen: u32, room: usize) -> Result<()> {
        if caplen > MAX_CAPLEN {
            return Err(self.format_error(
                start,
                format!("captured length {caplen} exceeds the maximum {MAX_CAPLEN}"),
            ));
        }
        if caplen as usize > room {
            return Err(self.format_error(
                start,
                format!("captured length {caplen} exceeds the block ({room} bytes of data)"),
            ));
        }
        Ok(())
    }

    /// An Enhanced Packet Block (pcapng §4.3) or obsolete Packet Block (Appendix A) whose content
    /// is `buf[..content]`; both have 20 bytes of fixed fields before the data.
    fn packet_block(&mut self, start: u64, ty: u32, content: usize) -> Result<Record> {
        let e = self.endian;
        let b = &self.buf[..content];
        let id = if ty == NG_EPB {
            e.u32(b, 0)
        } else {
            u32::from(e.u16(b, 0))
        };
        let ts = (u64::from(e.u32(b, 4)) << 32) | u64::from(e.u32(b, 8));
        let (caplen, origlen) = (e.u32(b, 12), e.u32(b, 16));
        let iface = self.interface(start, id)?;
        self.check_caplen(start, caplen, content - 20)?;
        Ok(Record {
            start: 20,
            len: caplen as usize,
            meta: PacketMeta {
                timestamp_ns: iface.timestamp_ns(ts),
                wire_len: origlen.max(caplen),
                ..PacketMeta::default()
            },
            linktype: iface.linktype,
        })
    }

    /// A Simple Packet Block (pcapng §4.4): no timestamp (0), interface 0, captured length
    /// min(snaplen, original length) (snaplen 0 means no limit).
    fn simple_packet_block(&mut self, start: u64, content: usize) -> Result<Record> {
        let origlen = self.endian.u32(&self.buf, 0);
        let iface = self.interface(start, 0)?;
        let caplen = if iface.snaplen == 0 {
            origlen
        } else {
            origlen.min(iface.snaplen)
        };
        self.check_caplen(start, caplen, content - 4)?;
        Ok(Record {
            start: 4,
            len: caplen as usize,
            meta: PacketMeta {
                timestamp_ns: 0,
                wire_len: origlen,
                ..PacketMeta::default()
            },
            linktype: iface.linktype,
        })
    }
}

impl<R: Read> Source for PcapReader<R> {
    /// Copies the next packets into `batch` (truncating each to `batch.buf_size()`; `wire_len`
    /// keeps the original length). A batch holds packets of one link type only. When the file
    /// turns out damaged after some packets were gathered, those are returned and the error
    /// comes with the next call.
    fn recv(&mut self, batch: &mut PacketBatch) -> Result<usize> {
        batch.clear();
        while !batch.is_full() {
            let rec = match self.next_record() {
                Ok(Some(rec)) => rec,
                Ok(None) => break,
                Err(e) if batch.is_empty() => return Err(e),
                Err(e) => {
                    self.pending = Some(e);
                    break;
                }
            };
            if !batch.is_empty() && rec.linktype != self.last_linktype {
                self.held = Some(rec);
                break;
            }
            self.records += 1;
            self.last_linktype = rec.linktype;
            batch.push(&self.buf[rec.start..rec.start + rec.len], rec.meta);
        }
        Ok(batch.len())
    }
}

/// Reads until `out` is full or the input ends; returns how many bytes were read.
fn read_full(rd: &mut impl Read, out: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < out.len() {
        match rd.read(&mut out[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A copy of `e` to return again (an I/O error keeps its kind and message).
fn copy_error(e: &Error) -> Error {
    match e {
        Error::Io { path, source } => Error::Io {
            path: path.clone(),
            source: io::Error::new(source.kind(), source.to_string()),
        },
        Error::Format {
            path,
            offset,
            reason,
        } => Error::Format {
            path: path.clone(),
            offset: *offset,
            reason: reason.clone(),
        },
        Error::Option { name, reason } => Error::Option {
            name,
            reason: reason.clone(),
        },
        Error::Device {
            device,
            what,
            source,
        } => Error::Device {
            device: device.clone(),
            what: what.clone(),
            source: io::Error::new(source.kind(), source.to_string()),
        },
    }
}

/// Timestamp resolution of a classic pcap file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TsResolution {
    /// Microseconds (magic `0xA1B2C3D4`), what every tool reads.
    #[default]
    Micro,
    /// Nanoseconds (magic `0xA1B23C4D`).
    Nano,
}

/// How [`PcapWriter`] writes its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WriterOptions {
    /// Timestamp resolution (default microseconds).
    pub resolution: TsResolution,
    /// Snapshot length, 1..=[`MAX_CAPLEN`] (default [`DEFAULT_SNAPLEN`]); longer packets are
    /// stored truncated to it.
    pub snaplen: u32,
    /// Link type, at most 65535 (default [`LINKTYPE_ETHERNET`]).
    pub linktype: u32,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            resolution: TsResolution::Micro,
            snaplen: DEFAULT_SNAPLEN,
            linktype: LINKTYPE_ETHERNET,
        }
    }
}

impl WriterOptions {
    /// The defaults with nanosecond timestamps.
    pub fn nanos() -> Self {
        WriterOptions {
            resolution: TsResolution::Nano,
            ..WriterOptions::default()
        }
    }

    fn validate(&self) -> Result<()> {
        if self.snaplen == 0 || self.snaplen > MAX_CAPLEN {
            return Err(Error::Option {
                name: "snaplen",
                reason: format!("expected 1..={MAX_CAPLEN}, got {}", self.snaplen),
            });
        }
        if self.linktype > 0xFFFF {
            return Err(Error::Option {
                name: "linktype",
                reason: format!("expected at most 65535, got {}", self.linktype),
            });
        }
        Ok(())
    }
}

/// Writes a classic pcap file: little-endian, version 2.4, buffered.
///
/// Each packet is written with its timestamp and `wire_len` (raised to the stored length when
/// smaller); packets longer than the snapshot length are stored truncated to it. Call
/// [`finish`](Self::finish) (or [`flush`](Self::flush)) at the end to see write errors; dropping
/// the writer flushes too but ignores them.
pub struct PcapWriter<W: Write = File> {
    w: BufWriter<W>,
    path: PathBuf,
    opts: WriterOptions,
    /// Bytes written so far (the offset of the next record).
    pos: u64,
    packets: u64,
}

impl<W: Write> fmt::Debug for PcapWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PcapWriter")
            .field("path", &self.path)
            .field("opts", &self.opts)
            .field("offset", &self.pos)
            .field("packets", &self.packets)
            .finish_non_exhaustive()
    }
}

impl PcapWriter<File> {
    /// Creates (or truncates) the file at `path` and writes a header with the default options
    /// (microseconds, snaplen 262144, Ethernet).
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        PcapWriter::create_with(path, WriterOptions::default())
    }

    /// Creates (or truncates) the file at `path` and writes a header with `opts`.
    pub fn create_with(path: impl AsRef<Path>, opts: WriterOptions) -> Result<Self> {
        opts.validate()?;
        let path = path.as_ref();
        let file = File::create(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        PcapWriter::new(file, path, opts)
    }
}

impl<W: Write> PcapWriter<W> {
    /// Writes a capture to `writer` (buffered here), naming it `name_for_errors` in errors.
    /// The file header goes into the buffer at once.
    pub fn new(
        writer: W,
        name_for_errors: impl Into<PathBuf>,
        opts: WriterOptions,
    ) -> Result<Self> {
        opts.validate()?;
        let mut w = PcapWriter {
            w: BufWriter::with_capacity(IO_BUFFER, writer),
            path: name_for_errors.into(),
            opts,
            pos: 0,
            packets: 0,
        };
        let magic = match opts.resolution {
            TsResolution::Micro => MAGIC_MICROS,
            TsResolution::Nano => MAGIC_NANOS,
        };
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&magic.to_le_bytes());
        h[4..6].copy_from_slice(&PCAP_VERSION.0.to_le_bytes());
        h[6..8].copy_from_slice(&PCAP_VERSION.1.to_le_bytes());
        // thiszone and sigfigs (8..16) stay 0.
        h[16..20].copy_from_slice(&opts.snaplen.to_le_bytes());
        h[20..24].copy_from_slice(&opts.linktype.to_le_bytes());
        w.write_all(&h)?;
        Ok(w)
    }

    /// Appends one packet.
    pub fn write_packet(&mut self, data: &[u8], meta: &PacketMeta) -> Result<()> {
        let secs = meta.timestamp_ns / NANOS_PER_SEC;
        let sub_ns = meta.timestamp_ns % NANOS_PER_SEC;
        let Ok(secs) = u32::try_from(secs) else {
            return Err(Error::Format {
                path: self.path.clone(),
                offset: self.pos,
                reason: format!(
                    "timestamp {} ns is past the classic pcap limit (2106-02-07)",
                    meta.timestamp_ns
                ),
            });
        };
        let frac = match self.opts.resolution {
            TsResolution::Micro => sub_ns / 1_000,
            TsResolution::Nano => sub_ns,
        } as u32;
        let stored = data.len().min(self.opts.snaplen as usize);
        let wire = meta
            .wire_len
            .max(u32::try_from(data.len()).unwrap_or(u32::MAX));
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&secs.to_le_bytes());
        h[4..8].copy_from_slice(&frac.to_le_bytes());
        h[8..12].copy_from_slice(&(stored as u32).to_le_bytes());
        h[12..16].copy_from_slice(&wire.to_le_bytes());
        self.write_all(&h)?;
        self.write_all(&data[..stored])?;
        self.packets += 1;
        Ok(())
    }

    /// Number of packets written.
    pub fn packets_written(&self) -> u64 {
        self.packets
    }

    /// The name used in errors (the path for [`create`](PcapWriter::create)).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Pushes buffered bytes to the underlying writer and flushes it.
    pub fn flush(&mut self) -> Result<()> {
        self.w.flush().map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(self) -> Result<W> {
        let path = self.path;
        self.w
            .into_inner()
            .map_err(|e| Error::Io {
                path: path.clone(),
                source: e.into_error(),
            })
            .and_then(|mut w| {
                w.flush().map_err(|source| Error::Io { path, source })?;
                Ok(w)
            })
    }

    fn write_all(&mut self, b: &[u8]) -> Result<()> {
        self.w.write_all(b).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        self.pos += b.len() as u64;
        Ok(())
    }
}

impl<W: Write> Sink for PcapWriter<W> {
    fn send(&mut self, batch: &PacketBatch) -> Result<()> {
        for (data, meta) in batch.iter() {
            self.write_packet(data, meta)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        PcapWriter::flush(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsresol_scales() {
        assert_eq!(TsScale::from_tsresol(6).to_ns(1_500_000), 1_500_000_000);
        assert_eq!(TsScale::from_tsresol(9).to_ns(123), 123);
        assert_eq!(TsScale::from_tsresol(0).to_ns(2), 2_000_000_000);
        assert_eq!(TsScale::from_tsresol(12).to_ns(5_000), 5);
        assert_eq!(TsScale::from_tsresol(127).to_ns(u64::MAX), 0);
        // 2^-10 s units: 1024 of them are a second.
        assert_eq!(TsScale::from_tsresol(0x80 | 10).to_ns(1024), 1_000_000_000);
        assert_eq!(TsScale::from_tsresol(0x80 | 127).to_ns(u64::MAX), 0);
        assert_eq!(TsScale::from_tsresol(0x80).to_ns(3), 3_000_000_000);
        // Huge counts saturate instead of wrapping.
        let i = Interface {
            linktype: 1,
            snaplen: 0,
            scale: TsScale::from_tsresol(0),
            offset_ns: 0,
        };
        assert_eq!(i.timestamp_ns(u64::MAX), u64::MAX);
        let i = Interface {
            offset_ns: -10 * i128::from(NANOS_PER_SEC),
            ..i
        };
        assert_eq!(i.timestamp_ns(3), 0);
        assert_eq!(i.timestamp_ns(11), NANOS_PER_SEC);
    }

    #[test]
    fn endian_reads() {
        let b = [1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(Endian::Little.u16(&b, 0), 0x0201);
        assert_eq!(Endian::Big.u32(&b, 0), 0x0102_0304);
        assert_eq!(Endian::Big.u64(&b, 0), 0x0102_0304_0506_0708);
        assert_eq!(Endian::Little.u64(&b, 0), 0x0807_0605_0403_0201);
    }

    #[test]
    fn errors_repeat_after_the_first() {
        let mut r = PcapReader::new(
            &[
                0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 1, 0, 0, 0,
                9,
            ][..],
            "x.pcap",
        )
        .unwrap();
        for _ in 0..3 {
            match r.next_packet() {
                Err(Error::Format { offset, .. }) => assert_eq!(offset, 24),
                other => panic!("{other:?}"),
            }
        }
    }
}
