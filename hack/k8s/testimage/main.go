// Command probe is the test image of the real node: a static binary that runs a list of
// steps and exits, so that a test pod does something real with nothing but this file.
//
//	probe STEP [ARG...] [+ STEP [ARG...]]...
//
// Steps:
//
//	echo TEXT...          print TEXT (one line)
//	lines N [DELAY]       print "line 1" ... "line N", DELAY seconds apart (default 0)
//	resolve NAME [SECS]   look NAME up (the pod's resolv.conf: search list, ndots), retrying
//	                      for up to SECS seconds (default 30); print "NAME -> ADDR..."
//	write PATH TEXT       write TEXT to PATH
//	read PATH [SECS]      print the content of PATH, waiting up to SECS seconds for it
//	sleep SECS            sleep ("inf": until killed)
//	alloc MIB             allocate and touch MIB mebibytes, keep them
//	exit CODE             exit with CODE
//	exit-if NAME VALUE CODE  exit with CODE when the environment variable NAME is VALUE
//	term SECS [FILE]      from now on, a SIGTERM prints "got SIGTERM" and the process exits
//	                      143 SECS seconds later (a trainer that takes time to stop); FILE
//	                      gets "sigterm <unix time>" and "exit <unix time>" lines
//
// A failed step prints its error and exits 1.
package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var kept [][]byte

func seconds(s string) time.Duration {
	if s == "inf" {
		return time.Duration(math.MaxInt64)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		fail("not a number of seconds: %q", s)
	}
	return time.Duration(f * float64(time.Second))
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "probe: "+format+"\n", args...)
	os.Exit(1)
}

func arg(args []string, i int, def string) string {
	if i < len(args) {
		return args[i]
	}
	if def == "" {
		fail("step %q needs more arguments", strings.Join(args, " "))
	}
	return def
}

func resolve(name string, within time.Duration) {
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		addrs, err := net.DefaultResolver.LookupHost(ctx, name)
		cancel()
		if err == nil {
			fmt.Printf("%s -> %s\n", name, strings.Join(addrs, " "))
			return
		}
		if time.Now().After(deadline) {
			fail("resolve %s: %v", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// note appends "<what> <unix time>" to file (if any).
func note(file, what string) {
	if file == "" {
		return
	}
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "probe: %v\n", err)
		return
	}
	fmt.Fprintf(f, "%s %.3f\n", what, float64(time.Now().UnixNano())/1e9)
	f.Close()
}

func step(args []string) {
	switch args[0] {
	case "echo":
		fmt.Println(strings.Join(args[1:], " "))
	case "lines":
		n, err := strconv.Atoi(arg(args, 1, ""))
		if err != nil {
			fail("lines: %v", err)
		}
		delay := seconds(arg(args, 2, "0"))
		for i := 1; i <= n; i++ {
			if i > 1 {
				time.Sleep(delay)
			}
			fmt.Printf("line %d\n", i)
		}
	case "resolve":
		resolve(arg(args, 1, ""), seconds(arg(args, 2, "30")))
	case "write":
		if err := os.WriteFile(arg(args, 1, ""), []byte(arg(args, 2, "")), 0o644); err != nil {
			fail("write: %v", err)
		}
	case "read":
		path, deadline := arg(args, 1, ""), time.Now().Add(seconds(arg(args, 2, "0")))
		for {
			b, err := os.ReadFile(path)
			if err == nil {
				fmt.Println(string(b))
				break
			}
			if time.Now().After(deadline) {
				fail("read: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	case "sleep":
		time.Sleep(seconds(arg(args, 1, "")))
	case "alloc":
		mib, err := strconv.Atoi(arg(args, 1, ""))
		if err != nil {
			fail("alloc: %v", err)
		}
		for i := 0; i < mib; i++ {
			b := make([]byte, 1<<20)
			for j := range len(b) / 4096 {
				b[j*4096] = 1
			}
			kept = append(kept, b)
		}
		fmt.Printf("allocated %d MiB\n", mib)
	case "term":
		linger := seconds(arg(args, 1, ""))
		file := ""
		if len(args) > 2 {
			file = args[2]
		}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		go func() {
			<-ch
			fmt.Println("got SIGTERM")
			note(file, "sigterm")
			time.Sleep(linger)
			note(file, "exit")
			os.Exit(143)
		}()
	case "exit-if":
		if os.Getenv(arg(args, 1, "")) == arg(args, 2, "") {
			code, err := strconv.Atoi(arg(args, 3, ""))
			if err != nil {
				fail("exit-if: %v", err)
			}
			os.Exit(code)
		}
	case "exit":
		code, err := strconv.Atoi(arg(args, 1, ""))
		if err != nil {
			fail("exit: %v", err)
		}
		os.Exit(code)
	default:
		fail("unknown step %q", args[0])
	}
}

func main() {
	var cur []string
	for _, a := range append(os.Args[1:], "+") {
		if a != "+" {
			cur = append(cur, a)
			continue
		}
		if len(cur) > 0 {
			step(cur)
		}
		cur = nil
	}
}
