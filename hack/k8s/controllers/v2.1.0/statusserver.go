// Trainer v2.1.0 has no status server: this file replaces ../statusserver.go.
package main
