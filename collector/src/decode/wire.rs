//! A borrowing scan of the protobuf wire format, so a large export is decoded one record
//! at a time instead of as one tree of wire types (issue 17 #14: a 19 MiB export held
//! ~17× its size while decoding).
//!
//! [`Fields`] walks the fields of one message without copying: each item is the field
//! number and its value, a length-delimited value as a slice of the body. The rules are the
//! encoding spec's (protobuf.dev "Encoding": "Message Structure", "Base 128 Varints",
//! "Length-Delimited Records", groups): field number 0 and wire types 6–7 are malformed;
//! unknown fields of any type, groups included, are skipped as prost skips them, with one
//! difference: prost counts skipped groups against the recursion budget of the whole
//! message tree (100 levels), this scan gives each message its own [`MAX_GROUP_DEPTH`], so
//! an unknown field holding ~100 nested groups inside a deep value, which prost refuses,
//! is skipped here (found by a differential run against the prost path). The stack stays
//! bounded: messages nest at most as deep as the attribute nesting limit allows.

/// Deepest group nesting skipped inside an unknown field of one message (prost's
/// recursion limit, counted per message here).
const MAX_GROUP_DEPTH: u32 = 100;

/// prost's words for a known field sent with another wire type: what was found, then
/// what was expected (`invalid wire type: LengthDelimited (expected Varint)`), as static
/// text so the scan's errors stay `&'static str`.
macro_rules! wire_type_error {
    ($found:expr, $expected:literal) => {
        match $found {
            Value::Varint(_) => concat!("invalid wire type: Varint (expected ", $expected, ")"),
            Value::Fixed64(_) => {
                concat!("invalid wire type: SixtyFourBit (expected ", $expected, ")")
            }
            Value::Fixed32(_) => {
                concat!("invalid wire type: ThirtyTwoBit (expected ", $expected, ")")
            }
            Value::Len(_) => {
                concat!(
                    "invalid wire type: LengthDelimited (expected ",
                    $expected,
                    ")"
                )
            }
            Value::Group => concat!("invalid wire type: StartGroup (expected ", $expected, ")"),
        }
    };
}

/// One field's value on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1: 8 bytes, little-endian (`fixed64`, `double`).
    Fixed64(u64),
    /// Wire type 5: 4 bytes, little-endian (`fixed32`, `float`).
    Fixed32(u32),
    /// Wire type 2: the record's bytes.
    Len(&'a [u8]),
    /// Wire type 3 … 4: a (deprecated) group, skipped whole.
    Group,
}

/// The fields of one message, in wire order.
pub(super) struct Fields<'a> {
    buf: &'a [u8],
    failed: bool,
}

impl<'a> Fields<'a> {
    /// Scans `buf`, one encoded message.
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Self { buf, failed: false }
    }

    /// One varint. Tags, lengths of a span's fields and small numbers take one or two
    /// bytes, read here without the general loop ([`Fields::varint_slow`]).
    #[inline(always)]
    fn varint(&mut self) -> Result<u64, &'static str> {
        match *self.buf {
            [b0, ref rest @ ..] if b0 < 0x80 => {
                self.buf = rest;
                Ok(u64::from(b0))
            }
            [b0, b1, ref rest @ ..] if b1 < 0x80 => {
                self.buf = rest;
                Ok(u64::from(b0 & 0x7f) | (u64::from(b1) << 7))
            }
            _ => self.varint_slow(),
        }
    }

    /// Varints of three bytes or more, and the end of the buffer: kept out of line so
    /// that [`Fields::varint`] stays small enough to inline into every field read.
    #[cold]
    #[inline(never)]
    fn varint_slow(&mut self) -> Result<u64, &'static str> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let Some((&b, rest)) = self.buf.split_first() else {
                return Err("buffer underflow");
            };
            self.buf = rest;
            if i == 9 && b > 1 {
                return Err("invalid varint");
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("invalid varint")
    }

    #[inline(always)]
    fn take(&mut self, n: u64) -> Result<&'a [u8], &'static str> {
        let n = usize::try_from(n).map_err(|_| "buffer underflow")?;
        if n > self.buf.len() {
            return Err("buffer underflow");
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    #[inline(always)]
    fn tag(&mut self) -> Result<(u32, u8), &'static str> {
        let key = self.varint()?;
        let field = u32::try_from(key >> 3).map_err(|_| "invalid key value")?;
        if field == 0 || field > 0x1fff_ffff {
            return Err("invalid tag value");
        }
        Ok((field, (key & 7) as u8))
    }

    /// The next field. Inlined with [`Iterator::next`] into each message's loop (a
    /// closure here stayed a call per field: ~8% of a trace export's decode-and-encode
    /// instructions, callgrind, issue 16).
    #[inline(always)]
    fn field(&mut self) -> Result<(u32, Value<'a>), &'static str> {
        let (field, wt) = self.tag()?;
        match wt {
            3 => self.skip_group(field, 1).map(|()| (field, Value::Group)),
            4 => Err("unexpected end group tag"),
            _ => Ok((field, self.value(wt)?)),
        }
    }

    /// Skips a group body up to its end tag (`field`, wire type 4).
    #[cold]
    #[inline(never)]
    fn skip_group(&mut self, field: u32, depth: u32) -> Result<(), &'static str> {
        if depth > MAX_GROUP_DEPTH {
            return Err("recursion limit reached");
        }
        loop {
            let (f, wt) = self.tag()?;
            match wt {
                4 if f == field => return Ok(()),
                4 => return Err("unexpected end group tag"),
                3 => self.skip_group(f, depth + 1)?,
                _ => {
                    self.value(wt)?;
                }
            }
        }
    }

    #[inline(always)]
    fn value(&mut self, wire_type: u8) -> Result<Value<'a>, &'static str> {
        Ok(match wire_type {
            0 => Value::Varint(self.varint()?),
            1 => {
                let b = self.take(8)?;
                let mut le = [0u8; 8];
                le.copy_from_slice(b);
                Value::Fixed64(u64::from_le_bytes(le))
            }
            2 => {
                let n = self.varint()?;
                Value::Len(self.take(n)?)
            }
            5 => {
                let b = self.take(4)?;
                let mut le = [0u8; 4];
                le.copy_from_slice(b);
                Value::Fixed32(u32::from_le_bytes(le))
            }
            6 => return Err("invalid wire type value: 6"),
            _ => return Err("invalid wire type value: 7"),
        })
    }
}

impl<'a> Iterator for Fields<'a> {
    /// `(field number, value)`, or what was malformed (then the scan ends).
    type Item = Result<(u32, Value<'a>), &'static str>;

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.buf.is_empty() {
            return None;
        }
        let r = self.field();
        self.failed = r.is_err();
        Some(r)
    }
}

/// A length-delimited field's bytes, or the error prost gives for another wire type.
pub(super) fn len<'a>(v: Value<'a>) -> Result<&'a [u8], &'static str> {
    match v {
        Value::Len(b) => Ok(b),
        other => Err(wire_type_error!(other, "LengthDelimited")),
    }
}

/// A varint field's value (`int32`, `int64`, `uint32`, `bool`, enums: the caller casts as
/// prost does), or prost's error for another wire type.
pub(super) fn varint(v: Value<'_>) -> Result<u64, &'static str> {
    match v {
        Value::Varint(n) => Ok(n),
        other => Err(wire_type_error!(other, "Varint")),
    }
}

/// A `fixed64` or `double` field's bits, or prost's error for another wire type.
pub(super) fn fixed64(v: Value<'_>) -> Result<u64, &'static str> {
    match v {
        Value::Fixed64(n) => Ok(n),
        other => Err(wire_type_error!(other, "SixtyFourBit")),
    }
}

/// A `fixed32` field, or prost's error for another wire type.
pub(super) fn fixed32(v: Value<'_>) -> Result<u32, &'static str> {
    match v {
        Value::Fixed32(n) => Ok(n),
        other => Err(wire_type_error!(other, "ThirtyTwoBit")),
    }
}

/// A `string` field, borrowed: UTF-8 checked, as prost checks it.
pub(super) fn str<'a>(v: Value<'a>) -> Result<&'a str, &'static str> {
    utf8(len(v)?).ok_or("invalid string value: data is not UTF-8 encoded")
}

/// `b` as text when it is valid UTF-8 (RFC 3629), else `None`.
///
/// Span names, attribute keys and most values are short ASCII, and the ingest path checks
/// every one of them: `std::str::from_utf8` walks a short string byte by byte until its
/// pointer is word-aligned (~8% of a protobuf trace export's decode-and-encode
/// instructions under callgrind, issue 16), where `<[u8]>::is_ascii` reads it a word at a
/// time. Text with any byte of 0x80 or above gets the full check.
#[inline]
pub(super) fn utf8(b: &[u8]) -> Option<&str> {
    if b.is_ascii() {
        // SAFETY: every byte is below 0x80, and a sequence of such bytes is valid UTF-8
        // (RFC 3629, section 3: each is a one-byte character).
        #[allow(unsafe_code)]
        let s = unsafe { std::str::from_utf8_unchecked(b) };
        Some(s)
    } else {
        std::str::from_utf8(b).ok()
    }
}

/// A `string` field, owned ([`str`]).
pub(super) fn string(v: Value<'_>) -> Result<String, &'static str> {
    str(v).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(buf: &[u8]) -> Result<Vec<(u32, Value<'_>)>, &'static str> {
        Fields::new(buf).collect()
    }

    #[test]
    fn walks_every_wire_type_and_skips_groups() {
        // 1: varint 150; 2: "hi"; 3: fixed64; 4: fixed32; 5: group holding 6: varint 1.
        let buf = [
            0x08, 0x96, 0x01, 0x12, 2, b'h', b'i', 0x19, 1, 2, 3, 4, 5, 6, 7, 8, 0x25, 1, 2, 3, 4,
            0x2b, 0x30, 0x01, 0x2c,
        ];
        assert_eq!(
            all(&buf).unwrap(),
            vec![
                (1, Value::Varint(150)),
                (2, Value::Len(b"hi")),
                (3, Value::Fixed64(0x0807_0605_0403_0201)),
                (4, Value::Fixed32(0x0403_0201)),
                (5, Value::Group),
            ]
        );
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        for bad in [
            &[0x12, 5, b'a'][..], // length past the end
            &[0x08, 0xff],        // truncated varint
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ], // 11 bytes
            &[0x00, 0x01],        // field 0
            &[0x0e],              // wire type 6
            &[0x0c],              // end group without a start
            &[0x0b, 0x10, 0x01],  // group never closed
        ] {
            assert!(all(bad).is_err(), "{bad:x?}");
        }
        assert_eq!(all(&[]).unwrap(), vec![]);
    }

    /// Varints of every length, at the fast paths' edges, read as prost encodes them;
    /// a non-minimal encoding too (prost accepts it).
    #[test]
    fn varints_of_every_length() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            (1 << 21) - 1,
            1 << 21,
            1 << 35,
            1 << 56,
            u64::MAX,
        ] {
            let mut buf = vec![0x08];
            prost::encoding::encode_varint(v, &mut buf);
            assert_eq!(all(&buf).unwrap(), vec![(1, Value::Varint(v))], "{v}");
            buf.truncate(buf.len() - 1);
            if buf.len() > 1 {
                assert!(all(&buf).is_err(), "{v} cut short");
            }
        }
        assert_eq!(
            all(&[0x08, 0x80, 0x00]).unwrap(),
            vec![(1, Value::Varint(0))]
        );
        assert_eq!(
            all(&[0x08, 0x81, 0x80, 0x00]).unwrap(),
            vec![(1, Value::Varint(1))]
        );
    }

    /// [`utf8`] agrees with `std::str::from_utf8` on ASCII, valid multi-byte text and
    /// every kind of invalid sequence, at every offset and length around word boundaries.
    #[test]
    fn utf8_agrees_with_std() {
        let cases: [&[u8]; 12] = [
            b"",
            b"gen_ai.tool.name",
            "na\u{ef}ve \u{2603} \u{1f980}".as_bytes(),
            &[0x80],                   // lone continuation byte
            &[0xc0, 0xaf],             // overlong '/'
            &[0xe0, 0x80, 0xaf],       // overlong, three bytes
            &[0xed, 0xa0, 0x80],       // UTF-16 surrogate U+D800
            &[0xf4, 0x90, 0x80, 0x80], // above U+10FFFF
            &[0xe2, 0x98],             // truncated
            &[0xff],
            &[0x7f, 0x00, 0x41],
            b"x\xce\xbb",
        ];
        for case in cases {
            for pad in 0..17 {
                let mut b = vec![b'a'; pad];
                b.extend_from_slice(case);
                b.extend(std::iter::repeat_n(b'z', 16 - pad));
                for start in 0..b.len() {
                    for end in start..=b.len() {
                        let part = &b[start..end];
                        assert_eq!(utf8(part), std::str::from_utf8(part).ok(), "{part:?}");
                    }
                }
            }
        }
        assert!(string(Value::Len(&[b'a'; 40][..])).is_ok());
        let mut bad = vec![b'a'; 40];
        bad[37] = 0xc3;
        assert_eq!(
            string(Value::Len(&bad)).unwrap_err(),
            "invalid string value: data is not UTF-8 encoded"
        );
    }

    #[test]
    fn strings_must_be_utf8_and_length_delimited() {
        assert_eq!(string(Value::Len(b"ok")).unwrap(), "ok");
        assert!(string(Value::Len(&[0xff])).is_err());
        assert_eq!(
            string(Value::Varint(1)).unwrap_err(),
            "invalid wire type: Varint (expected LengthDelimited)"
        );
        assert_eq!(
            fixed64(Value::Fixed32(1)).unwrap_err(),
            "invalid wire type: ThirtyTwoBit (expected SixtyFourBit)"
        );
        assert_eq!(
            varint(Value::Len(b"x")).unwrap_err(),
            "invalid wire type: LengthDelimited (expected Varint)"
        );
        assert_eq!(
            all(&[0x0f]).unwrap_err(),
            "invalid wire type value: 7",
            "field 1, wire type 7"
        );
    }
}
