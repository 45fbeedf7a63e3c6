//! RESP2, the Redis wire format, read bounded by construction: a line is refused past
//! `MAX_LINE` bytes without its end, a multi-bulk past the items a read may still take or
//! nested past `MAX_DEPTH`, a bulk past the bytes a read may still take; each before any
//! memory is taken for it. A bulk's buffer grows with the bytes that arrive, never with
//! the length a server claims. What a read may take is its `Budget`, set by the caller
//! from what it asked (the bound on the values it reads, a SCAN page); a bulk within it
//! tells the stream how many bytes are coming (`Paced`), so a large value has time to
//! arrive and a small reply does not.

use std::io::{self, Read, Write};

/// The longest reply line (a status, an error, a number): Redis's own are short.
pub const MAX_LINE: usize = 64 * 1024;
/// Nesting: a SCAN reply is an array holding an array; nothing we ask nests deeper.
pub const MAX_DEPTH: usize = 2;
/// A bulk is read in pieces of at most this many bytes (its buffer grows as they arrive).
const PIECE: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    Status(String),
    Error(String),
    Bulk(Vec<u8>),
    Array(Vec<Reply>),
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the store closed the connection")]
    Closed,
    #[error("reply part of {0} refused: over the bound")]
    OverBound(String),
    /// A bulk that says it holds more bytes than the read may still take.
    #[error("reply part of {0} bytes refused: over the bound")]
    BulkOverBound(u64),
    #[error("not a RESP2 reply ({0})")]
    Protocol(String),
}

/// What the replies of one read may still hold, together.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub bulk_bytes: u64,
    pub items: u64,
}

impl Budget {
    /// Replies of numbers and statuses only (SET, AUTH, EXISTS, EVAL's count).
    pub const SMALL: Budget = Budget {
        bulk_bytes: 0,
        items: 0,
    };
}

/// A command as RESP2 sends it: an array of bulk strings.
pub fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A stream that gives a reply more time once it knows more bytes are coming.
pub trait Paced {
    /// A bulk of `n` bytes, within the read's budget, is on its way.
    fn expect(&mut self, n: u64);
}

/// Replies read from `S` through one buffer of fixed size.
pub struct Reader<S> {
    inner: S,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl<S: Read + Write + Paced> Reader<S> {
    pub fn new(inner: S) -> Self {
        Reader {
            inner,
            buf: vec![0; MAX_LINE + 2].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    pub fn send(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.inner.write_all(bytes)?;
        self.inner.flush()?;
        Ok(())
    }

    /// Bytes already received and not yet read as a reply (a server that sent more than
    /// was asked).
    pub fn pending(&self) -> usize {
        self.end - self.start
    }

    fn fill(&mut self) -> Result<(), WireError> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let n = self.inner.read(&mut self.buf[self.end..])?;
        if n == 0 {
            return Err(WireError::Closed);
        }
        self.end += n;
        Ok(())
    }

    fn line(&mut self) -> Result<Vec<u8>, WireError> {
        let mut searched = self.start;
        loop {
            let held = &self.buf[searched..self.end];
            if let Some(i) = held.windows(2).position(|w| w == b"\r\n") {
                let at = searched + i;
                let line = self.buf[self.start..at].to_vec();
                self.start = at + 2;
                return Ok(line);
            }
            if self.end - self.start > MAX_LINE {
                return Err(WireError::OverBound(format!(
                    "a line of more than {MAX_LINE} bytes"
                )));
            }
            searched = self.end.saturating_sub(1).max(self.start);
            let before = self.start;
            self.fill()?;
            searched -= before; // `fill` moved the unread bytes to the front
        }
    }

    fn exact(&mut self, n: usize) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::new();
        while out.len() < n {
            if self.start == self.end {
                self.fill()?;
            }
            let take = (n - out.len()).min(self.end - self.start).min(PIECE);
            out.extend_from_slice(&self.buf[self.start..self.start + take]);
            self.start += take;
        }
        Ok(out)
    }

    /// One reply, within `budget` (what it takes is taken from it).
    pub fn reply(&mut self, budget: &mut Budget) -> Result<Reply, WireError> {
        self.reply_at(budget, 0)
    }

    fn reply_at(&mut self, budget: &mut Budget, depth: usize) -> Result<Reply, WireError> {
        let line = self.line()?;
        let (kind, rest) = match line.split_first() {
            Some((k, rest)) => (*k, rest),
            None => return Err(WireError::Protocol("an empty line".into())),
        };
        let text = || String::from_utf8_lossy(rest).into_owned();
        match kind {
            // Nothing we ask has statuses or errors inside an array: each line could hold
            // 64 KiB that no budget counts.
            b'+' | b'-' if depth > 0 => Err(WireError::Protocol("a status inside an array".into())),
            b'+' => Ok(Reply::Status(text())),
            b'-' => Ok(Reply::Error(text())),
            b':' => number(rest).map(Reply::Int),
            b'$' => match number(rest)? {
                -1 => Ok(Reply::Nil),
                n if n < 0 => Err(WireError::Protocol(format!("a bulk of length {n}"))),
                n if n as u64 > budget.bulk_bytes => Err(WireError::BulkOverBound(n as u64)),
                n => {
                    budget.bulk_bytes -= n as u64;
                    self.inner.expect(n as u64);
                    let data = self.exact(n as usize)?;
                    if self.exact(2)? != b"\r\n" {
                        return Err(WireError::Protocol("a bulk longer than it said".into()));
                    }
                    Ok(Reply::Bulk(data))
                }
            },
            b'*' => match number(rest)? {
                -1 => Ok(Reply::Nil),
                n if n < 0 => Err(WireError::Protocol(format!("{n} items"))),
                _ if depth >= MAX_DEPTH => Err(WireError::OverBound(format!(
                    "arrays nested deeper than {MAX_DEPTH}"
                ))),
                n if n as u64 > budget.items => Err(WireError::OverBound(format!("{n} items"))),
                n => {
                    budget.items -= n as u64;
                    let mut items = Vec::with_capacity((n as usize).min(1024));
                    for _ in 0..n {
                        items.push(self.reply_at(budget, depth + 1)?);
                    }
                    Ok(Reply::Array(items))
                }
            },
            other => Err(WireError::Protocol(format!(
                "a line starting with byte {other:#04x}"
            ))),
        }
    }
}

fn number(text: &[u8]) -> Result<i64, WireError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| {
            let shown = String::from_utf8_lossy(&text[..text.len().min(32)]).into_owned();
            WireError::Protocol(format!("{shown:?} is not a number"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A peer that has sent `bytes` (writes are dropped).
    struct Sent(Cursor<Vec<u8>>);
    impl Read for Sent {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            self.0.read(b)
        }
    }
    impl Write for Sent {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl Paced for Sent {
        fn expect(&mut self, _: u64) {}
    }

    fn parse(bytes: &[u8], budget: Budget) -> Result<Reply, WireError> {
        Reader::new(Sent(Cursor::new(bytes.to_vec()))).reply(&mut { budget })
    }

    const ROOMY: Budget = Budget {
        bulk_bytes: 1 << 20,
        items: 1000,
    };

    #[test]
    fn replies_of_every_kind() {
        assert_eq!(parse(b":42\r\n", ROOMY).unwrap(), Reply::Int(42));
        assert_eq!(
            parse(b"+OK\r\n", ROOMY).unwrap(),
            Reply::Status("OK".into())
        );
        assert_eq!(parse(b"$-1\r\n", ROOMY).unwrap(), Reply::Nil);
        assert_eq!(
            parse(b"*2\r\n$1\r\n0\r\n*1\r\n$3\r\nabc\r\n", ROOMY).unwrap(),
            Reply::Array(vec![
                Reply::Bulk(b"0".to_vec()),
                Reply::Array(vec![Reply::Bulk(b"abc".to_vec())])
            ])
        );
    }

    #[test]
    fn claims_past_the_budget_are_refused_before_reading() {
        let over = |r: Result<Reply, WireError>| {
            matches!(
                r,
                Err(WireError::OverBound(_) | WireError::BulkOverBound(_))
            )
        };
        assert!(over(parse(b"$1073741824\r\n", ROOMY)));
        assert!(over(parse(b"*4611686018427387904\r\n", ROOMY)));
        assert!(over(parse(&b"*1\r\n".repeat(1_000_000), ROOMY)));
        assert!(over(parse(&vec![b'x'; MAX_LINE + 10], ROOMY)));
        assert!(over(parse(b"$2\r\nab\r\n", Budget::SMALL)));
    }
}
