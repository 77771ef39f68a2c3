//! One HTTP/1.1 connection kept open across requests, as kube-scheduler's
//! extender client (Go's `http.Transport`) keeps it: the Filter+Prioritize
//! timings then hold what kube-scheduler pays per call, not a TCP connect
//! and a new server task each time.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::Error;

/// An open connection to `addr`.
pub struct Connection {
    addr: String,
    stream: BufReader<tokio::net::TcpStream>,
}

impl Connection {
    /// Connects to `addr`.
    pub async fn open(addr: &str) -> Result<Self, Error> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| failed(addr, e.to_string()))?;
        stream
            .set_nodelay(true)
            .map_err(|e| failed(addr, e.to_string()))?;
        Ok(Self {
            addr: addr.to_owned(),
            stream: BufReader::new(stream),
        })
    }

    /// `POST <path>` with a JSON body; the answer's status and body.
    pub async fn post(&mut self, path: &str, body: &[u8]) -> Result<(u16, Vec<u8>), Error> {
        let what = format!("POST http://{}{path}", self.addr);
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        let io = |e: std::io::Error| failed(&what, e.to_string());
        let stream = self.stream.get_mut();
        stream.write_all(head.as_bytes()).await.map_err(io)?;
        stream.write_all(body).await.map_err(io)?;
        let mut line = String::new();
        self.stream.read_line(&mut line).await.map_err(io)?;
        let status = line
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| failed(&what, format!("status line {line:?}")))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            line.clear();
            self.stream.read_line(&mut line).await.map_err(io)?;
            let header = line.trim_end().to_ascii_lowercase();
            if header.is_empty() {
                break;
            }
            if let Some(value) = header.strip_prefix("content-length:") {
                length = value.trim().parse::<usize>().ok();
            }
            if header.starts_with("transfer-encoding:") && header.contains("chunked") {
                chunked = true;
            }
        }
        let mut answer = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.stream.read_line(&mut line).await.map_err(io)?;
                let size = usize::from_str_radix(line.trim(), 16)
                    .map_err(|_| failed(&what, format!("chunk size {line:?}")))?;
                let mut chunk = vec![0; size + 2];
                self.stream.read_exact(&mut chunk).await.map_err(io)?;
                if size == 0 {
                    break;
                }
                answer.extend_from_slice(&chunk[..size]);
            }
        } else {
            let length = length.ok_or_else(|| failed(&what, "no Content-Length".into()))?;
            answer.resize(length, 0);
            self.stream.read_exact(&mut answer).await.map_err(io)?;
        }
        Ok((status, answer))
    }
}

fn failed(what: &str, why: String) -> Error {
    Error::Measure {
        what: what.to_owned(),
        why,
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A server that answers each request on one connection, first with a
    /// Content-Length, then chunked.
    #[tokio::test]
    async fn answers_on_one_connection_in_both_framings() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let answers = [
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst".to_owned(),
                "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nsec\r\n3\r\nond\r\n0\r\n\r\n"
                    .to_owned(),
            ];
            for answer in answers {
                let mut seen = Vec::new();
                while !seen.ends_with(b"{}") {
                    let mut buf = [0; 256];
                    let n = socket.read(&mut buf).await.unwrap();
                    seen.extend_from_slice(&buf[..n]);
                }
                socket.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        let mut connection = Connection::open(&addr).await.unwrap();
        let first = connection.post("/filter", b"{}").await.unwrap();
        assert_eq!(first, (200, b"first".to_vec()));
        let second = connection.post("/prioritize", b"{}").await.unwrap();
        assert_eq!(second, (201, b"second".to_vec()));
        server.await.unwrap();
    }
}
