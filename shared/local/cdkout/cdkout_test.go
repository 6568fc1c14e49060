package cdkout

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestFind(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "a", "b")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Find(deep); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("no template: error %v", err)
	}
	if err := os.MkdirAll(filepath.Join(root, "cdk.out"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(root, "cdk.out", "S.template.json")
	if err := os.WriteFile(want, []byte(`{"Resources":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := Find(deep); err != nil || got != want {
		t.Errorf("Find = %q, %v; want %q", got, err, want)
	}
	if err := os.WriteFile(filepath.Join(root, "cdk.out", "T.template.json"), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Find(deep); err == nil {
		t.Error("two templates: no error")
	}
}
