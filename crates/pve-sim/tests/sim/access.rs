//! Authentication: API tokens, tickets with cookie and CSRF token, 401 with an empty body.

use crate::{Sim, sim};

async fn login(s: &Sim) -> (String, String) {
    let r = s
        .post(
            "/access/ticket",
            &[("username", "root@pam"), ("password", "proxops")],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    (
        r.data()["ticket"].as_str().unwrap().to_string(),
        r.data()["CSRFPreventionToken"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

#[tokio::test]
async fn requests_without_credentials_get_401_with_an_empty_body() {
    let mut s = sim().await;
    s.auth = None;
    let r = s.get("/version").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.text, "");
}

#[tokio::test]
async fn a_wrong_token_secret_gets_401() {
    let mut s = sim().await;
    s.auth = Some("PVEAPIToken=root@pam!proxops=wrong".to_string());
    let r = s.get("/version").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.text, "");
}

#[tokio::test]
async fn the_api_token_works_for_writes_without_csrf() {
    let s = sim().await;
    let r = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await;
    assert_eq!(r.status, 200, "{r:?}");
}

#[tokio::test]
async fn tickets_work_as_cookie_and_writes_need_the_csrf_token() {
    let mut s = sim().await;
    let (ticket, csrf) = login(&s).await;
    s.auth = None;
    let cookie = format!("PVEAuthCookie={ticket}");
    let get = s
        .client
        .get(s.url("/version"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
    let no_csrf = s
        .client
        .post(s.url("/nodes/pve1/qemu"))
        .header("Cookie", &cookie)
        .form(&[("vmid", "101")])
        .send()
        .await
        .unwrap();
    assert_eq!(no_csrf.status(), 401);
    let with_csrf = s
        .client
        .post(s.url("/nodes/pve1/qemu"))
        .header("Cookie", &cookie)
        .header("CSRFPreventionToken", &csrf)
        .form(&[("vmid", "101")])
        .send()
        .await
        .unwrap();
    assert_eq!(with_csrf.status(), 200);
}

#[tokio::test]
async fn a_wrong_password_gets_401_from_the_ticket_endpoint() {
    let s = sim().await;
    let r = s
        .post(
            "/access/ticket",
            &[("username", "root@pam"), ("password", "nope")],
        )
        .await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn permissions_list_privileges_by_path() {
    let s = sim().await;
    let r = s.get("/access/permissions").await;
    assert_eq!(r.data()["/"]["VM.Allocate"], 1);
    let one = s.get_q("/access/permissions", &[("path", "/vms")]).await;
    assert_eq!(one.data().as_object().unwrap().len(), 1);
}

#[tokio::test]
async fn the_ticket_cookie_wins_over_a_token_header() {
    let s = sim().await;
    let (ticket, _csrf) = login(&s).await;
    // A valid cookie plus a bad token: the cookie decides, so the GET passes.
    let resp = s
        .client
        .get(s.url("/version"))
        .header("Cookie", format!("PVEAuthCookie={ticket}"))
        .header("Authorization", "PVEAPIToken=root@pam!proxops=wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn requests_are_logged_with_the_caller() {
    let s = sim().await;
    s.get("/version").await;
    let log = s.sim.control().requests();
    let last = log.requests.last().unwrap();
    assert_eq!(last.user.as_deref(), Some("root@pam!proxops"));
    assert_eq!(last.status, 200);
    assert_eq!(last.endpoint, "/version");
}
