//! SPDY/3 frames on the wire, and the header blocks' zlib streams.

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::SpdyError;
use crate::dictionary::HEADER_DICTIONARY;

/// Header names (lowercase) and values, in order.
pub type Headers = Vec<(String, String)>;

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const FLAG_FIN: u8 = 0x01;
/// The largest frame kinglet reads (SPDY allows 16 MiB; spdystream, the
/// peers' library, writes data in 32 KiB frames): a larger one is a
/// protocol error, never a buffer that size.
const MAX_FRAME: usize = 1 << 20;
/// The largest header block kinglet decompresses.
const MAX_HEADER_BLOCK: usize = 1 << 20;

/// A frame read from the peer.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        id: u32,
        headers: Headers,
        fin: bool,
    },
    SynReply {
        id: u32,
        fin: bool,
    },
    Data {
        id: u32,
        data: Bytes,
        fin: bool,
    },
    Rst {
        id: u32,
    },
    Ping(u32),
    GoAway,
    /// SETTINGS, WINDOW_UPDATE, HEADERS, unknown types: read, not acted on.
    Ignored,
}

/// A frame to send.
#[derive(Debug)]
pub enum Out {
    SynStream { id: u32, headers: Headers },
    SynReply { id: u32 },
    Data { id: u32, data: Bytes, fin: bool },
    Rst { id: u32, status: u32 },
    Ping(u32),
    GoAway,
}

pub fn header<'a>(h: &'a Headers, name: &str) -> Option<&'a str> {
    h.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// One direction's zlib stream each way: SPDY/3 compresses every header
/// block of a connection as one stream, primed with the dictionary.
pub struct HeaderCodec {
    compress: Compress,
    decompress: Decompress,
}

fn proto(m: impl Into<String>) -> SpdyError {
    SpdyError::Protocol(m.into())
}

impl Default for HeaderCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderCodec {
    pub fn new() -> Self {
        let mut compress = Compress::new(Compression::default(), true);
        // Primed as peers expect (they prime their inflater when the zlib
        // header asks for the dictionary).
        let _ = compress.set_dictionary(&HEADER_DICTIONARY);
        HeaderCodec {
            compress,
            decompress: Decompress::new(true),
        }
    }

    fn compress(&mut self, plain: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(plain.len() + 64);
        let start = self.compress.total_in();
        loop {
            let done = (self.compress.total_in() - start) as usize;
            out.reserve(256);
            self.compress
                .compress_vec(&plain[done..], &mut out, FlushCompress::Sync)
                .map_err(|e| proto(format!("compressing headers: {e}")))?;
            let consumed = (self.compress.total_in() - start) as usize == plain.len();
            // A sync flush is complete when it left room in the output.
            if consumed && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }

    fn decompress(&mut self, block: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(block.len() * 4 + 64);
        let start = self.decompress.total_in();
        loop {
            let (before_in, before_out) = (self.decompress.total_in(), self.decompress.total_out());
            let done = (before_in - start) as usize;
            if out.len() > MAX_HEADER_BLOCK {
                return Err(proto("header block too large"));
            }
            out.reserve(1024);
            match self
                .decompress
                .decompress_vec(&block[done..], &mut out, FlushDecompress::Sync)
            {
                Ok(Status::StreamEnd) => return Ok(out),
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.decompress
                        .set_dictionary(&HEADER_DICTIONARY)
                        .map_err(|e| proto(format!("header dictionary: {e}")))?;
                    continue;
                }
                Err(e) => return Err(proto(format!("decompressing headers: {e}"))),
            }
            let consumed = (self.decompress.total_in() - start) as usize == block.len();
            if consumed && out.len() < out.capacity() {
                return Ok(out);
            }
            let stalled = self.decompress.total_in() == before_in
                && self.decompress.total_out() == before_out;
            if stalled && out.len() < out.capacity() {
                return Err(proto("header block truncated"));
            }
        }
    }
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn encode_headers(h: &Headers) -> Vec<u8> {
    let mut b = Vec::new();
    put_u32(&mut b, h.len() as u32);
    for (n, v) in h {
        let n = n.to_ascii_lowercase();
        put_u32(&mut b, n.len() as u32);
        b.extend_from_slice(n.as_bytes());
        put_u32(&mut b, v.len() as u32);
        b.extend_from_slice(v.as_bytes());
    }
    b
}

fn control(kind: u16, flags: u8, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(8 + body.len());
    b.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    put_u32(&mut b, (u32::from(flags) << 24) | body.len() as u32);
    b.extend_from_slice(body);
    b
}

impl Out {
    pub fn encode(self, codec: &mut HeaderCodec) -> Result<Vec<u8>, SpdyError> {
        Ok(match self {
            Out::SynStream { id, headers } => {
                let mut body = Vec::new();
                put_u32(&mut body, id);
                put_u32(&mut body, 0); // associated stream
                body.extend_from_slice(&[0, 0]); // priority, slot
                body.extend(codec.compress(&encode_headers(&headers))?);
                control(SYN_STREAM, 0, &body)
            }
            Out::SynReply { id } => {
                let mut body = Vec::new();
                put_u32(&mut body, id);
                body.extend(codec.compress(&encode_headers(&Vec::new()))?);
                control(SYN_REPLY, 0, &body)
            }
            Out::Data { id, data, fin } => {
                let mut b = Vec::with_capacity(8 + data.len());
                put_u32(&mut b, id & 0x7fff_ffff);
                let flags = if fin { FLAG_FIN } else { 0 };
                put_u32(&mut b, (u32::from(flags) << 24) | data.len() as u32);
                b.extend_from_slice(&data);
                b
            }
            Out::Rst { id, status } => {
                let mut body = Vec::new();
                put_u32(&mut body, id);
                put_u32(&mut body, status);
                control(RST_STREAM, 0, &body)
            }
            Out::Ping(id) => control(PING, 0, &id.to_be_bytes()),
            Out::GoAway => control(GOAWAY, 0, &[0; 8]),
        })
    }
}

fn be32(b: &[u8], at: usize) -> Result<u32, SpdyError> {
    b.get(at..at + 4)
        .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| proto("frame too short"))
}

fn parse_headers(b: &[u8]) -> Result<Headers, SpdyError> {
    let n = be32(b, 0)? as usize;
    let mut at = 4;
    let mut out = Vec::new();
    let field = |at: &mut usize| -> Result<String, SpdyError> {
        let len = be32(b, *at)? as usize;
        let s = b
            .get(*at + 4..*at + 4 + len)
            .ok_or_else(|| proto("header block truncated"))?;
        *at += 4 + len;
        Ok(String::from_utf8_lossy(s).into_owned())
    };
    for _ in 0..n.min(1024) {
        let name = field(&mut at)?;
        let value = field(&mut at)?;
        // Several values of one name are joined by NUL.
        for v in value.split('\0') {
            out.push((name.to_ascii_lowercase(), v.to_string()));
        }
    }
    Ok(out)
}

/// Reads one frame; `None` at a clean end of the transport.
pub async fn read<R: AsyncRead + Unpin>(
    r: &mut R,
    codec: &mut HeaderCodec,
) -> Result<Option<Frame>, SpdyError> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let word = be32(&head, 0)?;
    let flags = head[4];
    let len = (be32(&head, 4)? & 0x00ff_ffff) as usize;
    if len > MAX_FRAME {
        return Err(proto("frame too large"));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    let fin = flags & FLAG_FIN != 0;
    if word & 0x8000_0000 == 0 {
        return Ok(Some(Frame::Data {
            id: word,
            data: body.into(),
            fin,
        }));
    }
    let kind = (word & 0xffff) as u16;
    let id = || be32(&body, 0).map(|v| v & 0x7fff_ffff);
    Ok(Some(match kind {
        SYN_STREAM => {
            let block = body.get(10..).ok_or_else(|| proto("short SYN_STREAM"))?;
            let headers = parse_headers(&codec.decompress(block)?)?;
            Frame::SynStream {
                id: id()?,
                headers,
                fin,
            }
        }
        SYN_REPLY | HEADERS => {
            // Decompressed even when unused: the zlib stream must advance.
            let block = body.get(4..).ok_or_else(|| proto("short SYN_REPLY"))?;
            codec.decompress(block)?;
            if kind == HEADERS {
                Frame::Ignored
            } else {
                Frame::SynReply { id: id()?, fin }
            }
        }
        RST_STREAM => Frame::Rst { id: id()? },
        PING => Frame::Ping(be32(&body, 0)?),
        GOAWAY => Frame::GoAway,
        _ => Frame::Ignored,
    }))
}
