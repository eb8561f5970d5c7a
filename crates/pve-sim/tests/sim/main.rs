//! Integration tests: each starts the simulator on 127.0.0.1:0 and talks to it over real
//! HTTP(S) with reqwest, one test per behaviour of BEHAVIOUR.md the simulator models.

// Helpers outside `#[test]` functions: a panic is how they report a failure.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod access;
mod acl;
mod backup;
mod binary;
mod cluster;
mod download;
mod faults;
mod lxc;
mod permission;
mod pools;
mod qemu;
mod snapshots;
mod snippets;
mod storage;
mod tasks;
mod transport;

use std::time::Duration;

use proxops_pve_sim::{RunningSim, SimConfig, start};
use serde_json::Value;

/// Task duration used by most tests: long enough to observe a running task.
pub const TASK: Duration = Duration::from_millis(40);

pub const TOKEN: &str = "PVEAPIToken=root@pam!proxops=proxops-dev-secret";

/// A simulator plus a client authenticated with the default API token.
pub struct Sim {
    pub sim: RunningSim,
    pub client: reqwest::Client,
    pub base: String,
    pub auth: Option<String>,
}

pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub async fn sim_with(config: SimConfig) -> Sim {
    install_provider();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = start(config, listener).await.unwrap();
    let base = sim.base_url();
    Sim {
        sim,
        client: reqwest::Client::new(),
        base,
        auth: Some(TOKEN.to_string()),
    }
}

/// Plain HTTP, short tasks.
pub async fn sim() -> Sim {
    sim_with(SimConfig {
        tls: false,
        task_duration: TASK,
        lock_timeout: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await
}

/// A simulator whose `task_type` tasks take 3 s, so checks made while such a task runs do run
/// inside it however loaded the machine (at [`TASK`] a create sometimes ended before the
/// first check).
pub async fn sim_with_slow(task_type: &str) -> Sim {
    sim_with(SimConfig {
        tls: false,
        task_duration: TASK,
        task_durations: [(task_type.to_owned(), Duration::from_secs(3))].into(),
        lock_timeout: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await
}

/// A response: status, reason phrase and JSON body (`Null` when empty or not JSON).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub text: String,
}

impl Resp {
    pub fn data(&self) -> &Value {
        &self.body["data"]
    }

    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    pub fn error(&self, key: &str) -> &str {
        self.body["errors"][key].as_str().unwrap_or("")
    }

    pub fn upid(&self) -> String {
        assert_eq!(self.status, 200, "expected a UPID, got {self:?}");
        self.data().as_str().expect("a UPID string").to_string()
    }
}

impl Sim {
    async fn send(&self, req: reqwest::RequestBuilder) -> Resp {
        let req = match &self.auth {
            Some(a) => req.header("Authorization", a),
            None => req,
        };
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Resp { status, body, text }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(self.client.get(self.url(path))).await
    }

    pub async fn get_q(&self, path: &str, query: &[(&str, &str)]) -> Resp {
        self.send(self.client.get(self.url(path)).query(query))
            .await
    }

    pub async fn post(&self, path: &str, form: &[(&str, &str)]) -> Resp {
        self.send(self.client.post(self.url(path)).form(form)).await
    }

    pub async fn put(&self, path: &str, form: &[(&str, &str)]) -> Resp {
        self.send(self.client.put(self.url(path)).form(form)).await
    }

    pub async fn delete(&self, path: &str, query: &[(&str, &str)]) -> Resp {
        self.send(self.client.delete(self.url(path)).query(query))
            .await
    }

    /// Polls a task until it stops; returns its status object.
    pub async fn wait(&self, upid: &str) -> Value {
        let node = upid.split(':').nth(1).unwrap().to_string();
        let path = format!("/nodes/{node}/tasks/{}/status", encode(upid));
        for _ in 0..500 {
            let r = self.get(&path).await;
            assert_eq!(r.status, 200, "{r:?}");
            if r.data()["status"] == "stopped" {
                return r.data().clone();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("task {upid} did not stop");
    }

    /// Waits for a task and asserts it ended OK.
    pub async fn wait_ok(&self, upid: &str) {
        let status = self.wait(upid).await;
        assert_eq!(status["exitstatus"], "OK", "{status}");
    }

    /// Creates a VM with one 8 GiB disk on local-lvm and net0, and waits for it.
    pub async fn create_vm(&self, vmid: &str, extra: &[(&str, &str)]) {
        let mut form = vec![
            ("vmid", vmid),
            ("name", "web"),
            ("memory", "1024"),
            ("scsi0", "local-lvm:8"),
            ("net0", "virtio,bridge=vmbr0"),
        ];
        form.extend_from_slice(extra);
        let upid = self.post("/nodes/pve1/qemu", &form).await.upid();
        self.wait_ok(&upid).await;
        self.wait_idle("pve1").await;
    }

    /// Waits until no task runs on `node` (e.g. the start task forked by `start=1`).
    pub async fn wait_idle(&self, node: &str) {
        for _ in 0..500 {
            let r = self
                .get_q(&format!("/nodes/{node}/tasks"), &[("source", "active")])
                .await;
            if r.body["total"] == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("tasks on {node} did not finish");
    }

    /// The VM's config (pending values merged).
    pub async fn config(&self, vmid: &str) -> Value {
        let r = self.get(&format!("/nodes/pve1/qemu/{vmid}/config")).await;
        assert_eq!(r.status, 200, "{r:?}");
        r.data().clone()
    }
}

pub fn encode(s: &str) -> String {
    s.replace(':', "%3A")
        .replace('/', "%2F")
        .replace('@', "%40")
        .replace('!', "%21")
}

/// Serves `files` (path -> bytes) on 127.0.0.1; returns the base URL.
pub async fn file_server(files: Vec<(&'static str, Vec<u8>)>) -> String {
    use axum::routing::get;
    let mut router = axum::Router::new();
    for (path, bytes) in files {
        router = router.route(path, get(move || async move { bytes.clone() }));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}
