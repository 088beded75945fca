//! The console: a web page at `/admin/ui/` on the admin listener, shipped inside the
//! binary (three files, no build step, no library), that reads and changes the gateway
//! through the admin API with the token the user gives it.
//!
//! The page's files are served without a token: they hold no data and no secret, and a
//! browser cannot send an `Authorization` header when it navigates. Everything the
//! page shows or changes goes through the API with `Authorization: Bearer` from the
//! page (no cookie, so another site's page cannot make the browser act), under a
//! strict Content-Security-Policy (only these files' script and style; calls only to
//! this origin; no inline script; no framing).

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/console.js");
const STYLE: &str = include_str!("ui/console.css");

/// Where the console is.
pub const PREFIX: &str = "/admin/ui";

/// What the page may load and do.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                      img-src 'self' blob: data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's file at `path` (under [`PREFIX`]), or `None` for a path that is not one.
pub fn asset(path: &str) -> Option<Response<Full<Bytes>>> {
    let (body, kind) = match path.strip_prefix(PREFIX)? {
        "" => return Some(redirect()),
        "/" | "/index.html" => (INDEX, "text/html; charset=utf-8"),
        "/console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "/console.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return None,
    };
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    secure(headers);
    Some(response)
}

/// `/admin/ui` → `/admin/ui/`, so the page's relative links resolve.
fn redirect() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::MOVED_PERMANENTLY;
    response
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/admin/ui/"));
    secure(response.headers_mut());
    response
}

fn secure(headers: &mut http::HeaderMap) {
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_its_three_files_with_the_security_headers_and_nothing_else() {
        for (path, kind) in [
            ("/admin/ui/", "text/html"),
            ("/admin/ui/console.js", "text/javascript"),
            ("/admin/ui/console.css", "text/css"),
        ] {
            let r = asset(path).expect(path);
            assert_eq!(r.status(), StatusCode::OK);
            let h = r.headers();
            assert!(h[header::CONTENT_TYPE].to_str().expect("ascii").starts_with(kind));
            assert!(h[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .expect("ascii")
                .contains("script-src 'self'"));
            assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
        }
        assert_eq!(
            asset("/admin/ui").expect("redirect").status(),
            StatusCode::MOVED_PERMANENTLY
        );
        assert!(asset("/admin/ui/../policy").is_none());
        assert!(asset("/admin/policy").is_none());
    }

    #[test]
    fn the_page_has_no_inline_script_or_style_and_weighs_under_300_kb() {
        assert!(!INDEX.contains("<script>") && !INDEX.contains("onclick=") && !INDEX.contains("style="));
        assert!(INDEX.len() + SCRIPT.len() + STYLE.len() < 300_000);
    }
}
