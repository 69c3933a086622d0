//! A small blocking HTTP/1.1 client for the management API (plain HTTP on loopback or a
//! trusted network; one request per connection, `Content-Length` or chunked answers).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use base64::Engine;

/// Why a call failed before an HTTP answer came.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `http://host:port[/prefix]`.
    #[error("bad URL `{0}` (expected http://HOST:PORT)")]
    Url(String),
    /// The broker could not be reached, or the connection broke.
    #[error("cannot reach the broker at {0}: {1}")]
    Io(String, std::io::Error),
    /// The answer is not HTTP.
    #[error("the answer from {0} is not HTTP: {1}")]
    Protocol(String, String),
}

/// An answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status code.
    pub status: u16,
    /// Body as text.
    pub body: String,
}

/// Where the API is and who calls it.
#[derive(Debug, Clone)]
pub struct Client {
    host_port: String,
    prefix: String,
    authorization: String,
    timeout: Duration,
}

impl Client {
    /// A client of `url` (`http://127.0.0.1:15672`) with Basic credentials.
    pub fn new(url: &str, user: &str, password: &str) -> Result<Client, ClientError> {
        let rest = url.strip_prefix("http://").ok_or_else(|| ClientError::Url(url.to_owned()))?;
        let (host_port, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if host_port.is_empty() {
            return Err(ClientError::Url(url.to_owned()));
        }
        let host_port = if host_port.contains(':') { host_port.to_owned() } else { format!("{host_port}:80") };
        let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        Ok(Client {
            host_port,
            prefix: prefix.to_owned(),
            authorization: format!("Basic {credentials}"),
            timeout: Duration::from_secs(30),
        })
    }

    /// Sends `method path` with an optional JSON body and extra headers.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Answer, ClientError> {
        let io = |e| ClientError::Io(self.host_port.clone(), e);
        let addr = self
            .host_port
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or_else(|| ClientError::Url(self.host_port.clone()))?;
        let mut stream = TcpStream::connect_timeout(&addr, self.timeout).map_err(io)?;
        stream.set_read_timeout(Some(self.timeout)).map_err(io)?;
        let body = body.unwrap_or("");
        let mut req = format!(
            "{method} {}{path} HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nAccept: application/json\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.prefix,
            self.host_port,
            self.authorization,
            body.len()
        );
        if !body.is_empty() {
            req.push_str("Content-Type: application/json\r\n");
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        stream.write_all(req.as_bytes()).map_err(io)?;
        let mut reader = BufReader::new(stream);
        let bad = |what: &str| ClientError::Protocol(self.host_port.clone(), what.to_owned());
        let mut line = String::new();
        reader.read_line(&mut line).map_err(io)?;
        let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad(&line))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            line.clear();
            reader.read_line(&mut line).map_err(io)?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = v.trim().parse::<usize>().ok(),
                    "transfer-encoding" => chunked = v.trim().eq_ignore_ascii_case("chunked"),
                    _ => {}
                }
            }
        }
        let mut raw = Vec::new();
        if chunked {
            loop {
                line.clear();
                reader.read_line(&mut line).map_err(io)?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|_| bad("chunk size"))?;
                if size == 0 {
                    break;
                }
                let mut chunk = vec![0; size + 2];
                reader.read_exact(&mut chunk).map_err(io)?;
                raw.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(n) = length {
            raw.resize(n, 0);
            reader.read_exact(&mut raw).map_err(io)?;
        } else {
            reader.read_to_end(&mut raw).map_err(io)?;
        }
        Ok(Answer { status, body: String::from_utf8_lossy(&raw).into_owned() })
    }
}
