use super::*;
use crate::policy::tokens::{TokenAllowance, TokenRules};

fn rules(tenant: TokenAllowance, route: Option<TokenAllowance>) -> TokenRules {
    TokenRules {
        default_max_tokens: 16,
        max_tokens: None,
        max_n: None,
        clamp: false,
        prompt_bytes_per_token: 4,
        route,
        default: Some(tenant),
        tenants: Default::default(),
    }
}

fn tpm(n: u64) -> TokenAllowance {
    TokenAllowance {
        tokens_per_minute: Some(n),
        ..TokenAllowance::default()
    }
}

fn call<'a>(rules: &'a TokenRules, tenant: &'a str, tokens: u64) -> Call<'a> {
    Call {
        route: "r",
        tenant,
        rules,
        tokens,
    }
}

#[tokio::test]
async fn reservations_take_from_every_limit_or_none_and_settle_gives_back() {
    let limits = Arc::new(Limits::local());
    let rules = rules(tpm(100), Some(tpm(150)));
    let (a, headroom) = limits.reserve(call(&rules, "a", 60)).await.expect("fits");
    let a = a.expect("held");
    assert_eq!(headroom.tokens.map(|l| (l.limit, l.remaining)), Some((100, 40)));
    // Tenant a has 40 left: 60 more is refused, and the route's count is untouched.
    match limits.reserve(call(&rules, "a", 60)).await {
        Err(Refused::Spent {
            limit,
            asked,
            left,
            retry_after,
            ..
        }) => {
            assert_eq!(limit.knob, "tokens.default.tokens_per_minute");
            assert_eq!((asked, left), (60, 40));
            // 20 tokens at 100 a minute: 12 s.
            assert!(
                retry_after.as_secs_f64() > 11.0 && retry_after.as_secs_f64() <= 12.0,
                "{retry_after:?}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Tenant b fits its own 100 but not the route's 90 left.
    let (b, _) = limits.reserve(call(&rules, "b", 80)).await.expect("fits");
    let refused = limits.reserve(call(&rules, "c", 20)).await.expect_err("the route's");
    assert!(matches!(refused, Refused::Spent { ref limit, .. } if limit.knob == "tokens.route.tokens_per_minute"));
    // a used 10 of its 60: 50 back, to a and to the route.
    a.settle(10);
    a.settle(0); // once
    let (c, _) = limits.reserve(call(&rules, "c", 20)).await.expect("given back");
    // Dropped unsettled: everything back.
    drop(b);
    drop(c);
    let (_, headroom) = limits.reserve(call(&rules, "b", 1)).await.expect("fits");
    assert_eq!(headroom.tokens.map(|l| l.remaining), Some(99));
}

#[tokio::test]
async fn a_call_larger_than_a_limit_can_never_pass() {
    let limits = Arc::new(Limits::local());
    let rules = rules(tpm(100), None);
    match limits.reserve(call(&rules, "a", 101)).await {
        Err(Refused::TooLarge { asked, limit }) => assert_eq!((asked, limit.limit), (101, 100)),
        other => panic!("expected too large, got {other:?}"),
    }
}

#[tokio::test]
async fn requests_and_periods_count_too() {
    let limits = Arc::new(Limits::local());
    let allowance = TokenAllowance {
        requests_per_minute: Some(2),
        daily_tokens: Some(50),
        ..TokenAllowance::default()
    };
    let rules = rules(allowance, None);
    let (one, headroom) = limits.reserve(call(&rules, "a", 30)).await.expect("fits");
    assert_eq!(headroom.requests.map(|l| (l.limit, l.remaining)), Some((2, 1)));
    // 30 of the day's 50 held: 30 more is refused until the day ends.
    match limits.reserve(call(&rules, "a", 30)).await {
        Err(Refused::Spent { limit, retry_after, .. }) => {
            assert_eq!(limit.knob, "tokens.default.daily_tokens");
            assert!(retry_after <= Duration::from_secs(86_400));
        }
        other => panic!("expected the day's, got {other:?}"),
    }
    one.expect("held").settle(5);
    let (_two, _) = limits.reserve(call(&rules, "a", 30)).await.expect("25 given back");
    // A third request within the minute: the requests' limit.
    let refused = limits.reserve(call(&rules, "a", 1)).await.expect_err("rpm");
    assert!(matches!(refused, Refused::Spent { ref limit, .. } if limit.knob == "tokens.default.requests_per_minute"));
}

#[test]
fn a_bucket_refills_over_the_minute_and_no_further() {
    let limit = Limit {
        key: "k".into(),
        knob: "tokens.default.tokens_per_minute".into(),
        limit: 600,
        window: Window::Minute,
        unit: Unit::Tokens,
    };
    let emptied = Count { level: 0.0, at: 0 };
    assert!((refilled(600.0, emptied, 30_000) - 300.0).abs() < 1e-9);
    assert!((refilled(600.0, emptied, 600_000) - 600.0).abs() < 1e-9);
    let (_, fits, wait) = check(&limit, Some(emptied), 100.0, 0);
    assert!(!fits);
    assert_eq!(wait, Duration::from_secs(10));
    assert_eq!(left(&limit, 300.0, 0).reset, Duration::from_secs(30));
    // Taken past its level by a settlement: in debt, refilled from below zero.
    let debt = given_back(&limit, emptied, -60.0, 0);
    assert!((refilled(600.0, debt, 6_000) - 0.0).abs() < 1e-9);
}
