//! The metadata a root and its instances attach to every frame: one GENEVE option (RFC 8926
//! §3.5) of flowstate's class, in a GENEVE header whose VNI is the chain stage. Data frames
//! carry the packet's Ethernet frame as payload; control frames (the move protocol, CHC §5.1,
//! and the packet log's notices, CHC §5) set the O bit; only the notices ([`Kind::Done`],
//! [`Kind::Committed`]) carry a payload: the packets they are about, 12 bytes each, the clock
//! (8) and the epoch it was processed at (4), big-endian. A watermark ([`Kind::Through`])
//! says it all in the header.
//!
//! ```text
//!  option data (16 bytes)
//!  0       1       2               4                               8
//! +-------+-------+---------------+-------------------------------+
//! | kind  | flags |   partition   |             epoch             |   flags: 1 inbound, 2 replay
//! +-------+-------+---------------+-------------------------------+
//! |                   logical clock (CHC §5)                      |
//! +---------------------------------------------------------------+
//! ```
//!
//! Tshark dissects the header and shows the option as class 0xfff0 (experimental use,
//! RFC 8926 §7.2), type 0x81 (critical: a receiver that does not know it must drop the frame).

use flowstate_nf::Direction;
use flowstate_wire::geneve;

/// flowstate's option class: in the experimental range of the IANA registry.
pub const OPTION_CLASS: u16 = 0xfff0;
/// The option type: 1, with the critical bit.
pub const OPTION_TYPE: u8 = 0x81;
/// Bytes of option data.
pub const OPTION_LEN: usize = 16;
/// Bytes of a GENEVE header with the option: where the payload starts.
pub const HEADER_LEN: usize = geneve::HEADER_LEN + 4 + OPTION_LEN;
/// UDP port of the data plane (GENEVE's).
pub const PORT: u16 = geneve::PORT;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A packet of the partition (root → owner: to process; owner → root: to send out).
    Data = 0,
    /// Root → old owner: every packet of the partition before this one has been sent to you;
    /// finish them, make the partition's state durable and let it go.
    Release = 1,
    /// Old owner → root: released (every output of the partition went before this frame).
    Released = 2,
    /// Root → new owner: take the partition at this epoch.
    Claim = 3,
    /// New owner → root: the partition is yours to send to.
    Ready = 4,
    /// Instance → root: the claim was refused (the ownership record has a newer epoch).
    Refused = 5,
    /// Instance → root: the chain is done with these packets (the payload's clocks) without
    /// an output: an NF dropped them, and what they changed is in the store. The root's delete
    /// request of CHC §5, for packets whose output cannot serve as one.
    Done = 6,
    /// Instance → root: the state changes of these packets (the payload's) are in the store:
    /// send on the outputs it sent for them before its commit ([`crate::log`]).
    Committed = 7,
    /// Instance → root: the partition's owner (at the header's epoch) committed every packet
    /// of the partition it took up to the header's clock, of the root that numbered it. Sent
    /// again while the partition is quiet: what the root still holds of those packets, their
    /// notices lost on the way, goes on or is given up ([`crate::log::PacketLog::through`]).
    Through = 8,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            0 => Kind::Data,
            1 => Kind::Release,
            2 => Kind::Released,
            3 => Kind::Claim,
            4 => Kind::Ready,
            5 => Kind::Refused,
            6 => Kind::Done,
            7 => Kind::Committed,
            8 => Kind::Through,
            _ => return None,
        })
    }
}

const FLAG_INBOUND: u8 = 1;
const FLAG_REPLAY: u8 = 2;

/// The metadata of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// What the frame is.
    pub kind: Kind,
    /// The chain stage (the GENEVE VNI).
    pub stage: u32,
    /// The traffic partition.
    pub partition: u16,
    /// The partition's ownership epoch the sender acts under.
    pub epoch: u32,
    /// Where the packet entered the root.
    pub direction: Direction,
    /// The packet's logical clock (CHC §5): the root numbers packets in arrival order.
    pub clock: u64,
    /// A packet the root sends again from its log (CHC §5.4): its first owner failed before
    /// the chain was done with it.
    pub replay: bool,
}

/// Why a datagram is not a frame of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// Not a GENEVE header (short, or another version).
    #[error("not GENEVE: {0}")]
    Geneve(flowstate_wire::Error),
    /// GENEVE without flowstate's option, or with one of the wrong length or kind.
    #[error("no flowstate option")]
    NoOption,
    /// A data frame whose payload is not Ethernet.
    #[error("payload protocol {0:#06x} is not Ethernet")]
    Protocol(u16),
}

/// Writes the header for `meta` at the start of `buf`; the payload (for [`Kind::Data`]) goes
/// at [`HEADER_LEN`]. Returns [`HEADER_LEN`], or `None` when `buf` is shorter.
pub fn write(buf: &mut [u8], meta: &Meta) -> Option<usize> {
    let mut data = [0u8; OPTION_LEN];
    data[0] = meta.kind as u8;
    data[1] = if meta.direction == Direction::Inbound {
        FLAG_INBOUND
    } else {
        0
    } | if meta.replay { FLAG_REPLAY } else { 0 };
    data[2..4].copy_from_slice(&meta.partition.to_be_bytes());
    data[4..8].copy_from_slice(&meta.epoch.to_be_bytes());
    data[8..16].copy_from_slice(&meta.clock.to_be_bytes());
    geneve::emit(
        buf,
        meta.kind != Kind::Data,
        geneve::PROTO_ETHERNET,
        meta.stage & 0xff_ffff,
        OPTION_CLASS,
        OPTION_TYPE,
        &data,
    )
}

/// Reads a datagram: its metadata and payload.
pub fn read(datagram: &[u8]) -> Result<(Meta, &[u8]), MetaError> {
    let g = geneve::Packet::new_checked(datagram).map_err(MetaError::Geneve)?;
    let d = g
        .option(OPTION_CLASS, OPTION_TYPE)
        .filter(|d| d.len() == OPTION_LEN)
        .ok_or(MetaError::NoOption)?;
    let kind = Kind::from_u8(d[0]).ok_or(MetaError::NoOption)?;
    if g.protocol() != geneve::PROTO_ETHERNET {
        return Err(MetaError::Protocol(g.protocol()));
    }
    let meta = Meta {
        kind,
        stage: g.vni(),
        partition: u16::from_be_bytes([d[2], d[3]]),
        epoch: u32::from_be_bytes([d[4], d[5], d[6], d[7]]),
        direction: if d[1] & FLAG_INBOUND != 0 {
            Direction::Inbound
        } else {
            Direction::Outbound
        },
        clock: u64::from_be_bytes([d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15]]),
        replay: d[1] & FLAG_REPLAY != 0,
    };
    let g = g.into_inner();
    Ok((meta, &g[HEADER_LEN.min(g.len())..]))
}

/// A packet a notice is about: its clock and the epoch it was processed at.
pub type Notice = (u64, u32);

/// Bytes of one packet in a notice's payload.
pub const NOTICE_ENTRY: usize = 12;

/// Writes a notice entry for the packet of `clock` processed at `epoch`.
pub fn write_notice(buf: &mut [u8], clock: u64, epoch: u32) -> Option<()> {
    let b = buf.get_mut(..NOTICE_ENTRY)?;
    b[..8].copy_from_slice(&clock.to_be_bytes());
    b[8..].copy_from_slice(&epoch.to_be_bytes());
    Some(())
}

/// The (clock, epoch) entries of a notice's payload (a trailing partial entry is ignored).
pub fn read_notice(payload: &[u8]) -> impl Iterator<Item = Notice> + '_ {
    payload.chunks_exact(NOTICE_ENTRY).map(|e| {
        let mut c = [0u8; 8];
        c.copy_from_slice(&e[..8]);
        (
            u64::from_be_bytes(c),
            u32::from_be_bytes([e[8], e[9], e[10], e[11]]),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = Kind> {
        (0u8..9).prop_map(|k| Kind::from_u8(k).unwrap())
    }

    proptest! {
        #[test]
        fn roundtrip(kind in kind(), stage in 0u32..1 << 24, partition: u16, epoch: u32,
                     inbound: bool, clock: u64, replay: bool, payload in proptest::collection::vec(any::<u8>(), 0..100)) {
            let meta = Meta {
                kind, stage, partition, epoch, clock, replay,
                direction: if inbound { Direction::Inbound } else { Direction::Outbound },
            };
            let mut buf = vec![0u8; HEADER_LEN + payload.len()];
            prop_assert_eq!(write(&mut buf, &meta), Some(HEADER_LEN));
            buf[HEADER_LEN..].copy_from_slice(&payload);
            let (m, p) = read(&buf).unwrap();
            prop_assert_eq!(m, meta);
            prop_assert_eq!(p, &payload[..]);
        }

        #[test]
        fn notices_roundtrip(entries in proptest::collection::vec((any::<u64>(), any::<u32>()), 0..20)) {
            let mut buf = vec![0u8; entries.len() * NOTICE_ENTRY + 5];
            for (k, &(c, e)) in entries.iter().enumerate() {
                prop_assert!(write_notice(&mut buf[k * NOTICE_ENTRY..], c, e).is_some());
            }
            prop_assert_eq!(read_notice(&buf).collect::<Vec<_>>(), entries);
        }

        #[test]
        fn any_bytes_read_without_panic(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = read(&b);
        }
    }

    #[test]
    fn foreign_geneve_is_refused() {
        let mut buf = [0u8; 64];
        let n = geneve::emit(
            &mut buf,
            false,
            geneve::PROTO_ETHERNET,
            1,
            0x0100,
            1,
            &[0; 16],
        );
        assert_eq!(read(&buf[..n.unwrap()]), Err(MetaError::NoOption));
        assert!(matches!(read(&[0u8; 4]), Err(MetaError::Geneve(_))));
        assert_eq!(
            write(
                &mut buf[..20],
                &Meta {
                    kind: Kind::Data,
                    stage: 0,
                    partition: 0,
                    epoch: 0,
                    clock: 0,
                    direction: Direction::Outbound,
                    replay: false,
                }
            ),
            None
        );
    }
}
