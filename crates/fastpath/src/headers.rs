//! The header fields tables match on and actions write.

use std::fmt;

/// The fields of a packet a table can match on and a rule can write: the IPv4 5-tuple, a
/// 32-bit metadata `mark` that carries one table's result to a later table's key (HyperSFC's
/// "result of an earlier table"), and the `egress` port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Headers {
    /// IPv4 source address.
    pub src_ip: u32,
    /// IPv4 destination address.
    pub dst_ip: u32,
    /// TCP/UDP source port.
    pub src_port: u16,
    /// TCP/UDP destination port.
    pub dst_port: u16,
    /// IP protocol.
    pub proto: u8,
    /// Metadata written by a table for a later one.
    pub mark: u32,
    /// Output port (0: none chosen).
    pub egress: u16,
}

/// One field of [`Headers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Field {
    /// `src_ip`.
    SrcIp = 0,
    /// `dst_ip`.
    DstIp = 1,
    /// `src_port`.
    SrcPort = 2,
    /// `dst_port`.
    DstPort = 3,
    /// `proto`.
    Proto = 4,
    /// `mark`.
    Mark = 5,
    /// `egress`.
    Egress = 6,
}

/// A set of fields, as a bit mask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fields(pub u8);

impl Fields {
    /// Whether the sets share a field.
    pub fn overlaps(self, other: Fields) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether every field of `other` is in this set.
    pub fn contains(self, other: Fields) -> bool {
        other.0 & !self.0 == 0
    }

    /// Adds `f`.
    pub fn with(self, f: Field) -> Fields {
        Fields(self.0 | 1 << f as u8)
    }

    /// The union.
    pub fn union(self, other: Fields) -> Fields {
        Fields(self.0 | other.0)
    }
}

impl Field {
    /// Every field, in declaration order.
    pub const ALL: [Field; 7] = [
        Field::SrcIp,
        Field::DstIp,
        Field::SrcPort,
        Field::DstPort,
        Field::Proto,
        Field::Mark,
        Field::Egress,
    ];

    /// The name in configuration.
    pub fn name(self) -> &'static str {
        match self {
            Field::SrcIp => "src_ip",
            Field::DstIp => "dst_ip",
            Field::SrcPort => "src_port",
            Field::DstPort => "dst_port",
            Field::Proto => "proto",
            Field::Mark => "mark",
            Field::Egress => "egress",
        }
    }

    /// The field named `name`.
    pub fn parse(name: &str) -> Option<Field> {
        Field::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Width in bits.
    pub fn bits(self) -> u32 {
        match self {
            Field::SrcIp | Field::DstIp | Field::Mark => 32,
            Field::SrcPort | Field::DstPort | Field::Egress => 16,
            Field::Proto => 8,
        }
    }

    /// The field's value in `h`.
    pub fn get(self, h: &Headers) -> u32 {
        match self {
            Field::SrcIp => h.src_ip,
            Field::DstIp => h.dst_ip,
            Field::SrcPort => u32::from(h.src_port),
            Field::DstPort => u32::from(h.dst_port),
            Field::Proto => u32::from(h.proto),
            Field::Mark => h.mark,
            Field::Egress => u32::from(h.egress),
        }
    }

    /// Writes `v` (truncated to the field's width) into `h`.
    pub fn set(self, h: &mut Headers, v: u32) {
        match self {
            Field::SrcIp => h.src_ip = v,
            Field::DstIp => h.dst_ip = v,
            Field::SrcPort => h.src_port = v as u16,
            Field::DstPort => h.dst_port = v as u16,
            Field::Proto => h.proto = v as u8,
            Field::Mark => h.mark = v,
            Field::Egress => h.egress = v as u16,
        }
    }

    /// Whether `v` fits the field.
    pub fn fits(self, v: u64) -> bool {
        v >> self.bits() == 0
    }

    fn from_u8(b: u8) -> Option<Field> {
        Field::ALL.get(usize::from(b)).copied()
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a table entry does to a packet (HyperSFC §III-A: actions run in the fast path; the
/// slow path only finds entries): up to [`Rule::MAX_WRITES`] field writes, a drop, and which of
/// its table's branches comes next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Field writes, applied in order.
    pub writes: [Option<(Field, u32)>; Rule::MAX_WRITES],
    /// Ends the pipeline with a drop.
    pub drop: bool,
    /// Index into the table's `branches` (ignored by a table without branches).
    pub branch: u8,
}

impl Rule {
    /// Most field writes in one rule.
    pub const MAX_WRITES: usize = 2;

    /// A rule that writes `v` into `f`.
    pub fn set(f: Field, v: u32) -> Rule {
        Rule {
            writes: [Some((f, v)), None],
            ..Rule::default()
        }
    }

    /// A rule that drops.
    pub fn dropping() -> Rule {
        Rule {
            drop: true,
            ..Rule::default()
        }
    }

    /// This rule with `branch`.
    pub fn to_branch(mut self, branch: u8) -> Rule {
        self.branch = branch;
        self
    }

    /// Applies the writes to `h`.
    pub fn apply(&self, h: &mut Headers) {
        for (f, v) in self.writes.iter().flatten() {
            f.set(h, *v);
        }
    }

    /// The fields the rule writes.
    pub fn written(&self) -> Fields {
        self.writes
            .iter()
            .flatten()
            .fold(Fields::default(), |s, (f, _)| s.with(*f))
    }
}

impl flowstate_state::Codec for Rule {
    fn encode(&self, out: &mut Vec<u8>) {
        for w in &self.writes {
            match w {
                Some((f, v)) => {
                    out.push(*f as u8 + 1);
                    out.extend_from_slice(&v.to_be_bytes());
                }
                None => out.extend_from_slice(&[0; 5]),
            }
        }
        out.push(u8::from(self.drop));
        out.push(self.branch);
    }

    fn decode(input: &mut &[u8]) -> Result<Self, flowstate_state::CodecError> {
        let mut rule = Rule::default();
        for w in &mut rule.writes {
            let tag = u8::decode(input)?;
            let v = u32::decode(input)?;
            if tag != 0 {
                let f = Field::from_u8(tag - 1)
                    .ok_or(flowstate_state::CodecError::Invalid("rule field"))?;
                *w = Some((f, v));
            }
        }
        rule.drop = bool::decode(input)?;
        rule.branch = u8::decode(input)?;
        Ok(rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_state::Codec;

    #[test]
    fn rules_survive_the_store_codec() {
        let r = Rule {
            writes: [Some((Field::DstIp, 0x0a00_0001)), Some((Field::Egress, 3))],
            drop: false,
            branch: 2,
        };
        let mut b = Vec::new();
        r.encode(&mut b);
        assert_eq!(Rule::decode(&mut &b[..]).unwrap(), r);
        let mut bad = b.clone();
        bad[0] = 99;
        assert!(Rule::decode(&mut &bad[..]).is_err());
        assert!(Rule::decode(&mut &b[..3]).is_err());
    }

    #[test]
    fn writes_truncate_to_the_field() {
        let mut h = Headers::default();
        Field::DstPort.set(&mut h, 0x1_0050);
        assert_eq!(h.dst_port, 0x50);
        assert!(Field::Proto.fits(255) && !Field::Proto.fits(256));
        assert_eq!(Field::parse("src_port"), Some(Field::SrcPort));
        assert_eq!(Field::parse("ttl"), None);
    }
}
