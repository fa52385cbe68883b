//! The one encoding between typed state and a backend's bytes.
//!
//! Keys and values implement [`Codec`]. Encoding happens only at a backend boundary (a flush,
//! a synchronous call, a read-through on a cache miss), never on the cached hot path. The
//! format is compact, big-endian and self-delimiting, so tuples and structs concatenate their
//! fields' encodings.

use flowstate_wire::FlowKey;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The input ended before the value did.
    #[error("truncated value")]
    Truncated,
    /// A tag or length is not one the type allows.
    #[error("invalid encoding: {0}")]
    Invalid(&'static str),
    /// Bytes were left after the value.
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

/// A type that state objects can hold and send to a backend.
pub trait Codec: Sized {
    /// Appends the encoding of `self` to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Reads one value from the front of `input`, advancing it.
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError>;

    /// The encoding as a new vector (one allocation for encodings up to 40 bytes: a flow
    /// key's, an NF's entry; an empty vector grows four times on the way to 13 bytes).
    fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(40);
        self.encode(&mut v);
        v
    }

    /// Decodes exactly one value from `bytes`.
    fn from_bytes(mut bytes: &[u8]) -> Result<Self, CodecError> {
        let v = Self::decode(&mut bytes)?;
        if bytes.is_empty() {
            Ok(v)
        } else {
            Err(CodecError::Trailing(bytes.len()))
        }
    }
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], CodecError> {
    if input.len() < n {
        return Err(CodecError::Truncated);
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

macro_rules! int_codec {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_be_bytes());
            }
            fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
                let b = take(input, core::mem::size_of::<$t>())?;
                let mut a = [0u8; core::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                Ok(<$t>::from_be_bytes(a))
            }
        }
    )*};
}
int_codec!(u8, u16, u32, u64, u128, i8, i16, i32, i64);

impl Codec for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        match take(input, 1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(CodecError::Invalid("bool")),
        }
    }
}

impl Codec for Ipv4Addr {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.octets());
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        Ok(u32::decode(input)?.into())
    }
}

impl Codec for Ipv6Addr {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.octets());
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        Ok(u128::decode(input)?.into())
    }
}

impl Codec for IpAddr {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            IpAddr::V4(a) => {
                out.push(4);
                a.encode(out);
            }
            IpAddr::V6(a) => {
                out.push(6);
                a.encode(out);
            }
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        match take(input, 1)?[0] {
            4 => Ok(IpAddr::V4(Ipv4Addr::decode(input)?)),
            6 => Ok(IpAddr::V6(Ipv6Addr::decode(input)?)),
            _ => Err(CodecError::Invalid("ip address family")),
        }
    }
}

impl Codec for FlowKey {
    fn encode(&self, out: &mut Vec<u8>) {
        self.src.encode(out);
        self.dst.encode(out);
        self.src_port.encode(out);
        self.dst_port.encode(out);
        self.proto.encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        Ok(FlowKey::new(
            IpAddr::decode(input)?,
            IpAddr::decode(input)?,
            u16::decode(input)?,
            u16::decode(input)?,
            u8::decode(input)?,
        ))
    }
}

/// Variable-length data: a LEB128 length, then the bytes.
fn encode_len(n: usize, out: &mut Vec<u8>) {
    let mut n = n as u64;
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn decode_len(input: &mut &[u8]) -> Result<usize, CodecError> {
    let mut n: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = take(input, 1)?[0];
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return usize::try_from(n).map_err(|_| CodecError::Invalid("length"));
        }
    }
    Err(CodecError::Invalid("length"))
}

impl Codec for Vec<u8> {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_len(self.len(), out);
        out.extend_from_slice(self);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let n = decode_len(input)?;
        Ok(take(input, n)?.to_vec())
    }
}

impl Codec for String {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_len(self.len(), out);
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let n = decode_len(input)?;
        String::from_utf8(take(input, n)?.to_vec()).map_err(|_| CodecError::Invalid("utf-8"))
    }
}

impl<T: Codec> Codec for Option<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.encode(out);
            }
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        match take(input, 1)?[0] {
            0 => Ok(None),
            1 => Ok(Some(T::decode(input)?)),
            _ => Err(CodecError::Invalid("option tag")),
        }
    }
}

macro_rules! tuple_codec {
    ($($name:ident),+) => {
        impl<$($name: Codec),+> Codec for ($($name,)+) {
            #[allow(non_snake_case)]
            fn encode(&self, out: &mut Vec<u8>) {
                let ($($name,)+) = self;
                $($name.encode(out);)+
            }
            fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
                Ok(($($name::decode(input)?,)+))
            }
        }
    };
}
tuple_codec!(A, B);
tuple_codec!(A, B, C);
tuple_codec!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip<T: Codec + PartialEq + core::fmt::Debug>(v: T) {
        let b = v.to_bytes();
        assert_eq!(T::from_bytes(&b).unwrap(), v);
        for cut in 0..b.len() {
            assert!(
                T::from_bytes(&b[..cut]).is_err(),
                "prefix of {cut} bytes decodes"
            );
        }
    }

    proptest! {
        #[test]
        fn values_round_trip(a in any::<u64>(), b in any::<i64>(), s in ".{0,40}",
                             v in proptest::collection::vec(any::<u8>(), 0..300),
                             ip in any::<[u8; 16]>(), p in any::<u16>()) {
            round_trip(a);
            round_trip(b);
            round_trip(s.clone());
            round_trip(v.clone());
            round_trip((a, Some(s), p));
            let k = FlowKey::new(IpAddr::from(ip), IpAddr::from([1, 2, 3, 4]), p, 80, 6);
            round_trip(k);
        }

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = FlowKey::from_bytes(&b);
            let _ = <(String, Vec<u8>, Option<u32>)>::from_bytes(&b);
        }
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        assert_eq!(u16::from_bytes(&[0, 1, 2]), Err(CodecError::Trailing(1)));
        assert_eq!(bool::from_bytes(&[2]), Err(CodecError::Invalid("bool")));
    }
}
