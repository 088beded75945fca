//! Who a request's work belongs to: its [`Tenant`], from the caller's credential when
//! the data plane authenticates (`[auth]`), anonymous otherwise. A leaf: the doors set
//! it (in the request's extensions), admission limits by it, and the offline tier and
//! the Batch API keep jobs, batches and files under it, so a tenant reads only its own.

use std::sync::Arc;

/// A tenant: named by its credential, or the anonymous one (no data-plane
/// authentication), which costs nothing to make or clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Tenant(Option<Arc<str>>);

impl Tenant {
    /// The tenant of every request when the data plane does not authenticate.
    pub fn anonymous() -> Self {
        Tenant(None)
    }

    /// The tenant called `name`.
    pub fn named(name: &str) -> Self {
        Tenant(Some(Arc::from(name)))
    }

    /// Its name (empty for the anonymous tenant), as the stores keep it.
    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }

    /// Whether it came from a credential.
    pub fn is_authenticated(&self) -> bool {
        self.0.is_some()
    }

    /// Whose `request` is, by name: its credential's tenant when the data plane
    /// authenticates, else the value of `header` (which any client can set), else ""
    /// (the anonymous tenant). Callers on a route pass its `tenant_header`
    /// (`policy::Route::tenant` is the same rule for a request's parts).
    pub fn name_of<B>(request: &http::Request<B>, header: &http::HeaderName) -> String {
        match request.extensions().get::<Tenant>() {
            Some(tenant) => tenant.name_in(request.headers(), header).to_owned(),
            None => Tenant::anonymous().name_in(request.headers(), header).to_owned(),
        }
    }

    /// As [`Tenant::name_of`], for a request admitted as this tenant with `headers`: its
    /// own name when authenticated, else the value of `header`, else "". A header value
    /// that is not visible ASCII names no tenant.
    pub fn name_in<'a>(&'a self, headers: &'a http::HeaderMap, header: &http::HeaderName) -> &'a str {
        match &self.0 {
            Some(name) => name,
            None => headers.get(header).and_then(|v| v.to_str().ok()).unwrap_or_default(),
        }
    }

    /// The tenant `request` was admitted as (anonymous when no door set one).
    pub fn of<B>(request: &http::Request<B>) -> Tenant {
        Tenant::of_parts(request.extensions())
    }

    /// The tenant a request's `extensions` carry (the anonymous one if none).
    pub fn of_parts(extensions: &http::Extensions) -> Tenant {
        extensions.get::<Tenant>().cloned().unwrap_or_default()
    }
}
