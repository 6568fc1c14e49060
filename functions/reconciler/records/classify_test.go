package records

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/shared/filters"
	"github.com/sockfleet/sockfleet/shared/local/filtermatch"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// Every transition has a golden record under testdata/, as Lambda delivers it. Each
// case says what the classifier decides and whether the production filter patterns
// let the record through at all.
var transitions = []struct {
	file   string
	want   Decision
	passes bool // by the event source filters
	bad    bool // the classifier reports the record unusable
}{
	// Needs an owner.
	{file: "insert_started", want: Decision{Action: NeedsOwner, ID: "c1", Why: WhyInserted}, passes: true},
	{file: "restarted", want: Decision{Action: NeedsOwner, ID: "c1", LeaseVersion: 3, Why: WhyRestarted}, passes: true},
	{file: "released", want: Decision{Action: NeedsOwner, ID: "c1", LeaseVersion: 3, Why: WhyReleased}, passes: true},
	{file: "released_expired", want: Decision{Action: NeedsOwner, ID: "c1", LeaseVersion: 3, Why: WhyReleased}, passes: true},
	{file: "nudged", want: Decision{Action: NeedsOwner, ID: "c1", LeaseVersion: 3, Why: WhyNudged}, passes: true},
	{file: "nudged_never_owned", want: Decision{Action: NeedsOwner, ID: "c1", Why: WhyNudged}, passes: true},
	// An operator deleting lease_owner by hand leaves the expiry set, so no filter can
	// tell it from a heartbeat; the sweep's nudge (which passes) picks it up.
	{file: "owner_removed", want: Decision{Action: NeedsOwner, ID: "c1", LeaseVersion: 3, Why: WhyOwnerRemoved}, passes: false},
	{file: "partial_new_image_only", want: Decision{Action: NeedsOwner, ID: "c1", LeaseVersion: 3, Why: WhyInserted}, passes: true},
	{file: "partial_old_malformed", want: Decision{Action: NeedsOwner, ID: "c1", Why: WhyRepaired}, passes: true},

	// The owner must act.
	{file: "stopped_owned", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 3, Why: WhyStopped}, passes: true},
	{file: "removed_owned", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 3, Why: WhyDeleted}, passes: true},
	{file: "partial_removed_malformed_owned", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 3, Why: WhyDeleted}, passes: true},
	// No pattern compares images; the owner sees the new URL on its next renew.
	{file: "url_changed", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 3, Why: WhyURLChanged}, passes: false},

	// A named owner with no proof it runs the lease (issue 21): "Create item" or
	// "Duplicate item" naming an owner, and an owned item whose expiry was deleted or
	// zeroed by hand. The named owner is asked; the handler releases if it does not
	// hold it.
	{file: "insert_owned", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 5, Why: WhyNamedOwner,
		Image: Image{Owner: "w1", Version: 5}}, passes: true},
	{file: "expiry_zeroed", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 5, Why: WhyExpiryDamaged,
		Image: Image{Owner: "w1", Version: 5}}, passes: true},
	{file: "expiry_deleted", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 5, Why: WhyExpiryDamaged,
		Image: Image{Owner: "w1", Version: 5}}, passes: true},

	// Ignored. Heartbeats and checkpoints must not even pass the filters.
	{file: "heartbeat", want: Decision{ID: "c1", LeaseVersion: 3}, passes: false},
	{file: "checkpoint_status", want: Decision{ID: "c1", LeaseVersion: 3}, passes: false},
	{file: "acquired", want: Decision{ID: "c1", LeaseVersion: 4}, passes: false},
	{file: "worker_heartbeat", want: Decision{}, passes: true}, // membership renewals drive dead-member detection
	{file: "stopped_unowned", want: Decision{ID: "c1", LeaseVersion: 3}, passes: true},
	{file: "stopped_released", want: Decision{ID: "c1", LeaseVersion: 3}, passes: true},
	{file: "url_changed_unowned", want: Decision{ID: "c1", LeaseVersion: 3}, passes: true},
	{file: "unowned_status_write", want: Decision{ID: "c1", LeaseVersion: 3}, passes: true},
	{file: "insert_stopped", want: Decision{ID: "c1"}, passes: true},
	{file: "removed_unowned", want: Decision{ID: "c1"}, passes: true},
	{file: "removed_keys_only", want: Decision{ID: "c1"}, passes: true},
	{file: "worker_inserted", want: Decision{}, passes: true},
	{file: "worker_removed", want: Decision{}, passes: true},
	// Connect-quota items (one write per dial): ignored, and never an invocation.
	{file: "quota_first_dial", want: Decision{}, passes: false},
	{file: "quota_dial_counted", want: Decision{}, passes: false},
	{file: "quota_held", want: Decision{}, passes: false},
	{file: "quota_expired", want: Decision{}, passes: false},
	// A STOPPED item's owner renews at most once more before it releases: the filters
	// cannot tell that renew from the stop itself, so it passes and is ignored here.
	{file: "stopped_renewed", want: Decision{ID: "c1", LeaseVersion: 3}, passes: true},

	// Stale images: an ownership no acquire made (the version fell, or the owner
	// changed without a higher one). The displaced holder is asked to check.
	{file: "stale_released", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 5, Why: WhyStale,
		Image: Image{Version: 3}}, passes: true},
	{file: "stale_stopped", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 5, Why: WhyStale,
		Image: Image{Owner: "w0", Version: 3}}, passes: true},
	// An image with a live-looking lease cannot be told from a heartbeat by a filter:
	// the holder's next owner write catches it (its lease store takes the lease back
	// when the stale lease is free), or the sweep at its expiry.
	{file: "stale_owned", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 5, Why: WhyStale,
		Image: Image{Owner: "w0", Version: 3}}, passes: false},
	{file: "stale_over_released", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w0", LeaseVersion: 3, Why: WhyStale,
		Image: Image{Owner: "w0", Version: 3}}, passes: false},
	// A deleted lease_version reads as 0: the holder is asked, and its store restores it.
	{file: "version_deleted_owned", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 5, Why: WhyStale,
		Image: Image{Owner: "w1"}}, passes: false},

	// An operator's bad value is said on the item, or its owner stops it and says why.
	{file: "invalid_state_unowned", want: Decision{Action: ReportInvalid, ID: "c1", LeaseVersion: 3, Why: WhyInvalid,
		Problem: `invalid desired_state "started": want STARTED or STOPPED`}, passes: true},
	{file: "invalid_reported", want: Decision{ID: "c1", LeaseVersion: 3}, passes: true},
	{file: "invalid_state_owned", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 5, Why: WhyInvalid,
		Problem: `invalid desired_state "started": want STARTED or STOPPED`}, passes: true},
	{file: "malformed_state", want: Decision{Action: OwnerMustAct, ID: "c1", Owner: "w1", LeaseVersion: 3, Why: WhyInvalid,
		Problem: `invalid desired_state "RUNNING": want STARTED or STOPPED`}, passes: true},
	{file: "malformed_url", want: Decision{Action: ReportInvalid, ID: "c1", Why: WhyInvalid,
		Problem: `invalid ws_url "http://feed.example/stream": scheme must be ws or wss`}, passes: true},
	// A lease field the lease store repairs at acquire: judged on what was readable.
	{file: "malformed_type", want: Decision{ID: "c1"}, passes: true},

	// Unusable: logged with the key and skipped.
	{file: "malformed_no_key", want: Decision{}, bad: true, passes: false}, // INSERT passes by key only
	{file: "malformed_modify_no_new_image", want: Decision{ID: "c1"}, bad: true, passes: false},
}

func loadRecord(t *testing.T, name string) (events.DynamoDBEventRecord, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var batch struct{ Records []json.RawMessage }
	if err := json.Unmarshal(raw, &batch); err != nil || len(batch.Records) != 1 {
		t.Fatalf("%s: want one record: %v", name, err)
	}
	r, err := DecodeRecord(batch.Records[0])
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r, batch.Records[0]
}

func TestClassifyTransitions(t *testing.T) {
	set := filtermatch.MustCompile(filters.Patterns)
	seen := map[string]bool{}
	for _, tc := range transitions {
		t.Run(tc.file, func(t *testing.T) {
			seen[tc.file] = true
			r, raw := loadRecord(t, tc.file)
			got, err := Classify(r)
			if (err != nil) != tc.bad {
				t.Fatalf("error %v, want error %v", err, tc.bad)
			}
			if err != nil && !errors.Is(err, schema.ErrInvalid) {
				t.Errorf("error %v does not wrap schema.ErrInvalid", err)
			}
			if got != tc.want {
				t.Errorf("decision\n got %+v\nwant %+v", got, tc.want)
			}
			passes, err := set.MatchJSON(raw)
			if err != nil {
				t.Fatal(err)
			}
			if passes != tc.passes {
				t.Errorf("filters pass it: %v, want %v", passes, tc.passes)
			}
			// The record Lambda would deliver re-encodes to something that filters the same.
			again, _ := json.Marshal(r)
			if p, _ := set.MatchJSON(again); p != passes && !tc.bad {
				t.Errorf("re-encoded record filters %v, original %v", p, passes)
			}
		})
	}
	files, _ := filepath.Glob("testdata/*.json")
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		if !seen[name] {
			t.Errorf("fixture %s has no case", name)
		}
	}
}

// TestActionableTransitionsPass is the filter's contract: every transition the
// classifier acts on reaches it, except those the filter package documents (a URL
// change, an operator's hand edit of lease_owner or lease_version, a stale image with
// a live-looking lease), which the owner's next write and the sweep catch instead. And
// no connection heartbeat or checkpoint ever invokes the function (worker heartbeats
// do, by design: one per worker per renew interval).
func TestActionableTransitionsPass(t *testing.T) {
	excused := map[string]bool{"url_changed": true, "owner_removed": true,
		"stale_owned": true, "stale_over_released": true, "version_deleted_owned": true}
	for _, tc := range transitions {
		if tc.want.Action != Ignore && !tc.passes && !excused[tc.file] {
			t.Errorf("%s: actionable (%s) but filtered out", tc.file, tc.want.Why)
		}
	}
	for _, f := range []string{"heartbeat", "checkpoint_status", "acquired"} {
		for _, tc := range transitions {
			if tc.file == f && tc.passes {
				t.Errorf("%s passes the filters: heartbeats would cost invocations", f)
			}
		}
	}
}

func TestClassifyIgnoresUnknownEventName(t *testing.T) {
	r, _ := loadRecord(t, "insert_started")
	r.EventName = "TRUNCATE"
	if _, err := Classify(r); !errors.Is(err, schema.ErrInvalid) {
		t.Fatalf("err %v, want ErrInvalid", err)
	}
}

func FuzzImageDecoder(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.json")
	for _, file := range files {
		raw, _ := os.ReadFile(file)
		var batch struct{ Records []json.RawMessage }
		if json.Unmarshal(raw, &batch) == nil && len(batch.Records) == 1 {
			f.Add([]byte(batch.Records[0]))
		}
	}
	f.Add([]byte(`{"eventName":"MODIFY","dynamodb":{"Keys":{"Pk":{"S":"CONN#x"}},"NewImage":{"Pk":{"S":"CONN#x"},"a":{"L":[{"M":{"b":{"NS":["1"]}}}]}}}}`))
	f.Add([]byte(`{"eventName":"INSERT","dynamodb":{"Keys":{"Pk":{"N":"1"}},"NewImage":{"Pk":{"BS":["AA=="]}}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, err := DecodeRecord(raw)
		if err != nil {
			return
		}
		d, err := Classify(r)
		if err != nil && d.Action != Ignore {
			t.Fatalf("an unusable record was acted on: %+v (%v)", d, err)
		}
		if d.Action != Ignore && schema.ValidateID(d.ID) != nil {
			t.Fatalf("acted on invalid id %q", d.ID)
		}
		if d.Action == OwnerMustAct && d.Owner == "" {
			t.Fatalf("owner-must-act without owner: %+v", d)
		}
	})
}
