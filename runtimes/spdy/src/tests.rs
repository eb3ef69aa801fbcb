use super::*;

fn h(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn streams_carry_headers_and_data_both_ways_until_fin() {
    let (a, b) = tokio::io::duplex(1 << 16);
    let (client, _none) = Conn::start(a, true);
    let (_server, mut incoming) = Conn::start(b, false);
    let opened = tokio::spawn(async move {
        let s = client
            .open(h(&[("streamType", "data"), ("port", "8080")]))
            .await
            .unwrap();
        (client, s)
    });
    let mut srv = incoming.recv().await.unwrap();
    assert_eq!(srv.header("streamtype"), Some("data"));
    assert_eq!(srv.header("Port"), Some("8080"));
    let (client, mut cli) = opened.await.unwrap();
    assert_eq!(cli.id % 2, 1, "client streams are odd");
    // A second stream: the header zlib stream goes on across blocks.
    let second = client.open(h(&[("streamtype", "error")])).await.unwrap();
    let srv2 = incoming.recv().await.unwrap();
    assert_eq!(srv2.header("streamtype"), Some("error"));
    assert_eq!(second.id, cli.id + 2);

    let big = vec![7u8; 100_000];
    cli.writer.write(&big).await.unwrap();
    cli.writer.close().await;
    let mut got = Vec::new();
    while let Some(b) = srv.reader.read().await {
        got.extend_from_slice(&b);
    }
    assert_eq!(got, big, "every byte, then the end at FIN");
    srv.writer.write(b"pong").await.unwrap();
    assert_eq!(&cli.reader.read().await.unwrap()[..], b"pong");
    srv.writer.reset().await;
    assert!(cli.reader.read().await.is_none(), "a reset ends reads");
}

#[tokio::test]
async fn header_blocks_ask_for_the_spdy_dictionary() {
    let mut c = frame::HeaderCodec::new();
    let block = frame::Out::SynStream {
        id: 1,
        headers: h(&[("streamtype", "stdin")]),
    }
    .encode(&mut c)
    .unwrap();
    // zlib header after the 18-byte SYN_STREAM prefix: FDICT set.
    assert_eq!(block[18] & 0x0f, 8, "deflate");
    assert_ne!(block[19] & 0x20, 0, "FDICT");
    let mut r = &block[..];
    let mut d = frame::HeaderCodec::new();
    let f = frame::read(&mut r, &mut d).await.unwrap().unwrap();
    assert_eq!(
        f,
        frame::Frame::SynStream {
            id: 1,
            headers: h(&[("streamtype", "stdin")]),
            fin: false
        }
    );
}

#[tokio::test]
async fn pings_are_answered_and_a_closed_transport_ends_streams() {
    let (a, mut b) = tokio::io::duplex(1 << 16);
    let (conn, _incoming) = Conn::start(a, false);
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = frame::HeaderCodec::new();
    b.write_all(&frame::Out::Ping(7).encode(&mut c).unwrap())
        .await
        .unwrap();
    let mut back = [0u8; 12];
    b.read_exact(&mut back).await.unwrap();
    assert_eq!(&back[8..], &7u32.to_be_bytes());
    // Garbage: the connection ends instead of panicking.
    b.write_all(&[0x80, 0x03, 0x00, 0x01, 0, 0, 0, 2, 1, 2])
        .await
        .unwrap();
    let mut closed = false;
    for _ in 0..100 {
        if matches!(conn.open(Vec::new()).await, Err(SpdyError::Closed)) {
            closed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(closed, "a malformed frame ends the connection");
}
