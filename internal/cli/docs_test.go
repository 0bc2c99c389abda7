package cli

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// TestDocumentedCommandsParse reads every `tenure ...` line in the code
// blocks of README.md and docs/cli.md and checks that the command exists
// and takes those flags and arguments, so the docs cannot drift from the
// command tree. Nothing is run.
func TestDocumentedCommandsParse(t *testing.T) {
	checked := 0
	for _, path := range []string{"../../README.md", "../../docs/cli.md"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		// Lines of sh blocks are commands, and so are "$ " lines of
		// sample sessions; other blocks hold synopses and output.
		var block string
		inBlock := false
		lines := strings.Split(string(b), "\n")
		for i := 0; i < len(lines); i++ {
			line := lines[i]
			if strings.HasPrefix(line, "```") {
				inBlock, block = !inBlock, strings.TrimPrefix(line, "```")
				continue
			}
			line = strings.TrimSpace(line)
			// A command continued over lines with \ is one command.
			for inBlock && strings.HasSuffix(line, "\\") && i+1 < len(lines) {
				i++
				line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(lines[i])
			}
			if !inBlock || (block != "sh" && !strings.HasPrefix(line, "$ ")) {
				continue
			}
			line = strings.TrimPrefix(line, "$ ")
			if !strings.HasPrefix(line, "tenure ") {
				continue
			}
			words, err := shellWords(line)
			if err != nil {
				t.Errorf("%s:%d: %q: %v", path, i+1, line, err)
				continue
			}
			if err := parseOnly(words[1:]); err != nil {
				t.Errorf("%s:%d: %q: got = %v, expected: a valid command line", path, i+1, line, err)
			}
			checked++
		}
	}
	if checked < 30 {
		t.Errorf("documented command lines checked: got = %d, expected: at least 30", checked)
	}
}

// parseOnly resolves args to a command and parses its flags and
// arguments as Execute would, without running it.
func parseOnly(args []string) error {
	root := NewRootCommand()
	root.InitDefaultCompletionCmd(args...)
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return err
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return err
	}
	if err := cmd.ValidateRequiredFlags(); err != nil {
		return err
	}
	return cmd.ValidateFlagGroups()
}

// shellWords splits a documented command line into words as sh would,
// for the little shell the docs use: quotes, a trailing comment, and
// ||, && or | after the command.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case !inWord && (r == '#' || r == '|' || r == '&'):
			return words, nil
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, errors.New("unclosed quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
