//! A real S3 API for the backup tests: moto's server (`pip install 'moto[server]'`, or
//! `CAIRN_MOTO_SERVER` naming its program), on an ephemeral loopback port, killed when
//! dropped. It keeps objects in memory and checks no signatures: any credentials do.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long moto may take to start (it imports a lot of Python).
const START_TIMEOUT: Duration = Duration::from_secs(60);

pub struct S3Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    host: String,
}

/// One object of a listing.
#[derive(Debug, Clone)]
pub struct Object {
    pub key: String,
    pub size: u64,
}

impl S3Server {
    pub fn start() -> S3Server {
        let program = std::env::var("CAIRN_MOTO_SERVER").unwrap_or_else(|_| "moto_server".into());
        let mut child = Command::new(&program)
            .args(["-H", "127.0.0.1", "-p", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {program} (pip install 'moto[server]', or set CAIRN_MOTO_SERVER): {e}")
            });
        // Werkzeug names the port it bound in a "Running on http://…" line, on stderr
        // (stdout in some versions): both are read, to the end, so neither pipe fills.
        let (tx, rx) = mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if let Some(at) = line.find("Running on http://127.0.0.1:") {
                        let rest = &line[at + "Running on http://".len()..];
                        let host: String = rest
                            .chars()
                            .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                            .collect();
                        let _ = tx.send(host);
                    }
                }
            });
        }
        let host = rx
            .recv_timeout(START_TIMEOUT)
            .expect("moto_server names its address");
        S3Server {
            child,
            endpoint: format!("http://{host}"),
            host,
        }
    }

    /// One HTTP/1.1 request; the status code and body.
    fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.host).expect("connect to moto");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.host,
            body.len()
        )
        .and_then(|()| stream.write_all(body))
        .expect("send to moto");
        let mut response = Vec::new();
        stream.read_to_end(&mut response).expect("moto's answer");
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default();
        (status, body)
    }

    pub fn create_bucket(&self, bucket: &str) {
        let (status, body) = self.request("PUT", &format!("/{bucket}"), b"");
        assert_eq!(status, 200, "create bucket {bucket}: {body}");
    }

    /// Writes an object (as a user's tool or a damaged disk would).
    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        let (status, body) = self.request("PUT", &format!("/{bucket}/{key}"), data);
        assert_eq!(status, 200, "put {bucket}/{key}: {body}");
    }

    /// Every object whose key starts with `prefix` (one page: tests hold fewer than 1,000).
    pub fn objects(&self, bucket: &str, prefix: &str) -> Vec<Object> {
        let (status, body) = self.request(
            "GET",
            &format!("/{bucket}?list-type=2&prefix={prefix}"),
            b"",
        );
        assert_eq!(status, 200, "list {bucket}/{prefix}: {body}");
        let field = |item: &str, name: &str| -> String {
            let open = format!("<{name}>");
            let close = format!("</{name}>");
            item.split_once(&open)
                .and_then(|(_, rest)| rest.split_once(&close))
                .map(|(value, _)| value.to_string())
                .unwrap_or_default()
        };
        body.split("<Contents>")
            .skip(1)
            .map(|item| Object {
                key: field(item, "Key"),
                size: field(item, "Size").parse().unwrap_or_default(),
            })
            .collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
