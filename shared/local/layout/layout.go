// Package layout holds no code, only the tests that keep the repository's layout
// true to its folder names (README.md, "Layout"):
//
//   - what ships never links what never leaves a developer's machine: the worker and
//     the reconciler import nothing under shared/local/ or cmd/, and the operator CLI
//     and the CDK app nothing under shared/local/;
//   - every package under shared/ (shared/local/ aside) is linked by two or more of
//     the deployables (worker, reconciler, operator CLI, CDK app), bar the exceptions
//     listed in the test with their reason;
//   - .dockerignore keeps out of the worker image's build context every tracked file
//     the worker's build does not read, and keeps in every file it does.
//
// The tests read the build graph with `go list` and the tracked files with
// `git ls-files`. Not checked: files that are not tracked (a build context sent from
// a working copy holds them too), and test-only imports, which no binary links.
package layout
