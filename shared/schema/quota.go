package schema

// Connect-quota items: one per upstream host, shared by every worker (docs/CONNECTIONS.md,
// "Connect quota and 429"). They are neither connections nor workers: the stream
// filters drop their writes, and every scan and classifier skips them by key.
const (
	QuotaPrefix = "QUOTA#"

	AttrQuotaWindow  = "window_ms"        // epoch ms: start of the window the count belongs to
	AttrQuotaDials   = "dials"            // dials admitted in that window, fleet-wide
	AttrBlockedUntil = "blocked_until_ms" // epoch ms: the host asked (429/418 Retry-After) for no dial before
)

// StatusRateLimited: the upstream answered the handshake 429 or 418; the stream waits
// for its Retry-After (or, without one, backs off).
const StatusRateLimited = "rate_limited"

// QuotaKey returns the partition key of host's quota item (host lower-cased by the caller).
func QuotaKey(host string) string { return QuotaPrefix + host }
