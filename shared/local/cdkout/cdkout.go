// Package cdkout finds the template `make template` synthesizes into cdk.out/: the
// one file both local enforcers (package iam for the policies, package netrules for
// the security groups) read, so they judge the same stack.
package cdkout

import (
	"errors"
	"fmt"
	"path/filepath"
)

// ErrNoTemplate says the synthesized template was not found.
var ErrNoTemplate = errors.New("no synthesized template (cdk.out/*.template.json); run `make template` to synthesize it")

// Find looks for cdk.out/*.template.json in dir and each of its parents and returns
// the first found. More than one template in that cdk.out is an error.
func Find(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		found, err := filepath.Glob(filepath.Join(d, "cdk.out", "*.template.json"))
		if err != nil {
			return "", err
		}
		switch len(found) {
		case 0:
		case 1:
			return found[0], nil
		default:
			return "", fmt.Errorf("find template: more than one in %s: %v", filepath.Join(d, "cdk.out"), found)
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("%w (looked from %s up)", ErrNoTemplate, dir)
		}
	}
}
