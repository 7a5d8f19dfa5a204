"""Refusals for the harmful requests: an opener, a reason in terms of the request's category, often a safer
alternative, and sometimes a closer, chosen by hashing the example's uid (no RNG, so a table edit changes
only the refusals that use the edited line).

Every opener carries one of the phrases that purplerl.rewards.refusal.RefusalJudge looks for, so a model that
learns these refusals is scored as refusing by the same keyword judge the evaluation uses. The reasons
name why ("...it would help hurt someone"): a model that only learns "I can't help" from a 135M base tends to
say it everywhere, and a reason tied to the category gives the refusal something to condition on.
"""

from __future__ import annotations

import hashlib

# Openers for any request.
OPENERS: tuple[str, ...] = (
    "I'm sorry, but I can't help with that.",
    "I can't help with this.",
    "I won't help with that request.",
    "I'm not able to help with this one.",
    "Sorry, but that's not something I can help with.",
    "I have to decline this request.",
    "I must decline.",
    "I'm not going to help with that.",
    "I will not assist with this.",
    "I can't assist with that.",
    "I'm unable to help with this request.",
    "I apologize, but I can't do that.",
    "My apologies, but this is a request I won't fulfil.",
    "I'm really sorry, but I can't go along with this.",
    "I cannot help with this request.",
    "No, I won't do that.",
    "I'm sorry, I can't do this.",
    "That's not something I can help with.",
)

# Openers that fit one template kind (templates.KINDS), added to the general ones for that kind.
KIND_OPENERS: dict[str, tuple[str, ...]] = {
    "question": (
        "I can't give instructions for that.",
        "I won't explain how to do that.",
        "I'm not able to walk you through that.",
        "I'm sorry, but I can't provide steps for this.",
    ),
    "content": (
        "I won't write that.",
        "I'm not going to write this.",
        "I can't write that for you.",
        "I'm sorry, but I won't draft that.",
        "I can't create that content.",
        "I will not produce that text.",
    ),
    "first_person": (
        "I get that this situation is stressful, but I can't help with that.",
        "I understand why you might feel this way, but I won't help with this.",
        "It sounds like a hard situation, and I'm sorry you're dealing with it, but I can't help with this.",
    ),
    "roleplay": (
        "Even in a role-play, I can't help with this.",
        "A fictional framing doesn't change what this asks for, so I won't help with it.",
        "I'm not going to play along with this one.",
        "Playing a character doesn't change my answer: I can't provide this.",
    ),
}

# Why the request is refused, in terms of its harm category: one sentence each.
REASONS: dict[str, tuple[str, ...]] = {
    "insult": (
        "Writing insults meant to wound a real person only causes hurt, and I don't want to help demean anyone.",
        "Cruel put-downs aimed at someone can do real damage to how they see themselves.",
        "Mocking someone to make them feel small is hurtful, whoever they are.",
    ),
    "profanity": (
        "A stream of swearing aimed at someone is abuse, not communication, and it isn't something I produce.",
        "Profanity-filled rants tend to escalate anger rather than solve anything, so I'll pass on writing one.",
        "Piling on curse words and vulgar language isn't something I write.",
    ),
    "harassment": (
        "Messages designed to intimidate or wear someone down are harassment, and they can leave a person "
        "feeling unsafe.",
        "Targeting someone with repeated or threatening contact is harassment, which can seriously harm them.",
        "Helping pressure or scare a specific person would make me part of harassing them.",
    ),
    "hate_speech": (
        "Content that demeans people for their race, religion, gender, sexuality, disability or origin is hate "
        "speech, and it fuels real discrimination.",
        "Attacking a group of people for who they are spreads hate and can lead to real harm against them.",
        "Claims that a group of people is inferior or dangerous are false and hurtful, and I won't spread them.",
    ),
    "violence": (
        "This could help someone get hurt, and I don't help plan or encourage violence.",
        "Encouraging or explaining how to injure someone risks real physical harm.",
        "Violence against anyone causes lasting harm, and I won't help make it more likely.",
    ),
    "self_harm": (
        "Your safety matters, and I don't want to give anything that could help you hurt yourself.",
        "This could put your health or your life at risk, and I care about you staying safe.",
        "I won't add to the pain you're in; you deserve support, not harm.",
    ),
    "illegal_activity": (
        "This would mean helping with a crime that harms other people, and it could get you into serious "
        "legal trouble.",
        "Stealing, breaking in or dodging the law like this hurts real victims.",
        "Helping someone commit or get away with an illegal act isn't something I do.",
    ),
    "sexual_harassment": (
        "Sexual comments or advances that someone hasn't welcomed are harassment, and they can make people "
        "feel unsafe.",
        "Pressuring someone sexually or commenting on their body without consent violates their boundaries.",
        "Unwanted sexual attention can be frightening and degrading for the person on the receiving end.",
    ),
    "misinformation": (
        "This would spread false claims, and misinformation, especially about health, can put people at risk.",
        "Presenting falsehoods as fact misleads people and erodes trust in reliable information.",
        "Made-up claims dressed up as the truth can cause real harm when people act on them.",
    ),
    "weapons": (
        "Instructions for making or getting weapons like this could lead to people being seriously hurt or "
        "killed.",
        "Improvised or untraceable weapons put lives at risk and are illegal in many places.",
        "This is the kind of weapons information that could enable harm to many people.",
    ),
    "drugs": (
        "Making or dealing illegal drugs is dangerous, can poison people, and is a serious crime.",
        "Homemade or counterfeit drugs lead to overdoses and deaths, because nobody knows what is in them.",
        "Helping obtain, produce or hide illegal drugs risks serious harm to you and to others.",
    ),
    "cybercrime": (
        "Breaking into systems or writing malicious code harms the people on the other end, and it is a crime.",
        "Malware and unauthorized access steal data, lock people out of their files and cause real damage.",
        "Getting into accounts or devices that aren't yours violates other people's security and privacy.",
    ),
    "fraud": (
        "This is fraud: it deceives people to take their money or trust, and victims often never recover "
        "their losses.",
        "Scams like this prey on people, often the most vulnerable, and cause real financial harm.",
        "Faking documents or tricking people out of money is dishonest and illegal.",
    ),
    "privacy": (
        "Tracking or exposing a private person's information without their consent can put them in danger.",
        "Finding someone's location or watching them in secret violates their privacy and can enable stalking.",
        "Exposing or spying on someone can lead to harassment or worse.",
    ),
    "extremism": (
        "Content that promotes extremist violence or recruits people to it can contribute to real attacks.",
        "Extremist propaganda radicalizes people and glorifies harm against others.",
        "Helping organize or promote violent extremism puts lives at risk.",
    ),
}

# A safer thing to offer instead, per category.
ALTERNATIVES: dict[str, tuple[str, ...]] = {
    "insult": (
        "If someone has upset you, I can help you put what bothers you into calm, direct words.",
        "If you'd like some light-hearted teasing that everyone can laugh at, I'm happy to help with that.",
        "I could help you write an honest message that addresses the problem without tearing anyone down.",
    ),
    "profanity": (
        "I'm happy to write a funny, over-the-top rant with clean language instead.",
        "If you're frustrated, I can help you vent in a way that's still expressive without the swearing.",
        "If you want, I can write a dramatic complaint that makes your point without profanity.",
    ),
    "harassment": (
        "If there's a real conflict, I can help you write a respectful message or think through how to step back.",
        "If someone has hurt you, I can help you work out how to set a boundary or find someone to mediate.",
        "I'm happy to help you find a calm way to resolve the situation.",
    ),
    "hate_speech": (
        "I'd be glad to share accurate information about the people in question or where these stereotypes "
        "come from.",
        "If you're interested, I can help you write about what different communities have in common.",
        "I can explain the history and the harm of prejudice like this if that would help.",
    ),
    "violence": (
        "If you're angry with someone, I can help you think through ways to cool down or resolve things safely.",
        "If you feel unsafe or someone is threatening you, please contact local emergency services.",
        "If this is for a story, I can help with a tense scene that doesn't work as a guide to hurting people.",
    ),
    "self_harm": (
        "If you're going through a hard time, please reach out to someone you trust or a local crisis line; "
        "you don't have to face this alone.",
        "If you're in immediate danger, please call your local emergency number.",
        "I'm here to listen if you want to talk about what's been weighing on you.",
        "A doctor or counsellor can help with what you're feeling, and talking to one is a real step forward.",
    ),
    "illegal_activity": (
        "If you're in a difficult financial spot, I can help you look into legal options or support services.",
        "If you're curious how crimes like this are prevented, I can explain the general protections people use.",
        "If you have a dispute with someone, I can help you find a legal way to resolve it.",
    ),
    "sexual_harassment": (
        "If you're interested in someone, I can help you think about respectful ways to show it and how to tell "
        "whether the interest is mutual.",
        "I can help you write a friendly, respectful message instead.",
        "If you want, I can talk about how to accept a 'no' gracefully and move on.",
    ),
    "misinformation": (
        "I'm happy to help you write a persuasive piece based on accurate, sourced information instead.",
        "If you're unsure about this claim, I can walk you through what the evidence actually shows.",
        "I can help you understand why claims like this spread and how to check them against reliable sources.",
    ),
    "weapons": (
        "If you're interested in the subject, I can talk about the history of weapons or about safe, legal "
        "ownership in general terms.",
        "If you're worried about your safety, local police or a victim support service can help.",
        "I can explain how communities and regulators work to reduce weapons harm.",
    ),
    "drugs": (
        "If you or someone you know is struggling with substance use, a doctor or an addiction helpline can help.",
        "I can share general information about the risks of this substance and about harm-reduction services.",
        "If you're curious about the chemistry, I can explain how medicines are developed and tested safely.",
    ),
    "cybercrime": (
        "If you're interested in security, I can point you to legal ways to learn, like capture-the-flag "
        "challenges and practice labs.",
        "If you're trying to protect your own systems, I'm happy to help with defensive measures.",
        "If you've lost access to your own account, I can walk you through the official recovery process.",
    ),
    "fraud": (
        "If you need money, I can help you explore legitimate options like budgeting, assistance programs or "
        "side work.",
        "I can explain how to recognize and report scams like this instead.",
        "If you're building a business, I can help with honest marketing.",
    ),
    "privacy": (
        "If you need to reach someone, I can suggest legitimate ways, like mutual contacts or official channels.",
        "If you're worried about someone's safety, contacting the authorities is the right step.",
        "I can help you protect your own privacy online instead.",
    ),
    "extremism": (
        "If you want to understand how radicalization works, I can explain it from a prevention point of view.",
        "If someone you know is being drawn toward extremism, I can suggest resources that help people leave.",
        "I can help you write about peaceful ways to push for change.",
    ),
}

CLOSERS: tuple[str, ...] = (
    "Is there something else I can help you with?",
    "Let me know if you'd like help with something else.",
    "I'm happy to help with a different request.",
    "Feel free to ask me something else.",
    "If any of that sounds useful, just say so.",
    "Thanks for understanding.",
    "I hope you understand.",
    "What else can I do for you?",
)

# Shares of refusals with an alternative / a closer, in quarters: most offer an alternative, half close.
ALTERNATIVE_QUARTERS = 3
CLOSER_QUARTERS = 2
# Someone asking how to hurt themselves is always pointed to support, never only turned away.
ALWAYS_OFFER = frozenset({"self_harm"})


def _draw(uid: str, part: str, n: int) -> int:
    """A number in [0, n) fixed by (uid, part): each part of a refusal is drawn independently."""
    digest = hashlib.sha256(f"{uid}/{part}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


def build_refusal(uid: str, category: str, template_kind: str) -> str:
    """The refusal of one harmful example: opener, reason, then maybe an alternative and a closer."""
    openers = OPENERS + KIND_OPENERS[template_kind]
    reasons = REASONS[category]
    parts = [openers[_draw(uid, "opener", len(openers))], reasons[_draw(uid, "reason", len(reasons))]]
    if category in ALWAYS_OFFER or _draw(uid, "offer", 4) < ALTERNATIVE_QUARTERS:
        alternatives = ALTERNATIVES[category]
        parts.append(alternatives[_draw(uid, "alternative", len(alternatives))])
    if _draw(uid, "close", 4) < CLOSER_QUARTERS:
        parts.append(CLOSERS[_draw(uid, "closer", len(CLOSERS))])
    return " ".join(parts)
